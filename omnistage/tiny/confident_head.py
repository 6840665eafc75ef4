"""``omnistage make-tiny --confident-head``: a random thinker whose greedy steps have a trained model's margins.

A random checkpoint's next-token logits are nearly flat: its final state points nowhere in particular, so the
top-1 and top-2 logits of the slice checkpoint lie a median 0.15 apart, and any perturbation (int8 weights, a
different kernel order) flips greedy tokens far more often than it would in a trained model, whose top-1 usually
leads by several logits. Agreement measured on such a checkpoint says little about a real one.

This rewrites two tensors of a made checkpoint so its greedy steps are confident while the decoder layers still
shape every logit:

* the token embeddings are scaled up (``EMBED_SCALE``), so the token's own direction survives to the final state
  next to what the layers add (on the slice checkpoint the final state's cosine with the token's embedding goes
  from 0.03 to about 0.5: the layers still carry half of it);
* the head gains, for a fixed random permutation ``succ`` of the ordinary (non-special) tokens, a row for
  ``succ[t]`` along token ``t``'s embedding direction (``HEAD_GAIN`` logits at cosine 1), on top of its random
  rows: "after t comes succ[t]", a bigram that the context can still override.

Measured on the slice checkpoint (``bench quant``, 4 prompts x 64 greedy tokens): top-1 minus top-2 logit median
3.35, 10th percentile 1.94 (plain slice: median 0.15). Special tokens are never a successor, so greedy replies
do not end early or emit control tokens. Nothing here changes a layer the quantizer or the verifier touches.
"""

from __future__ import annotations

import torch

EMBED_KEY = "thinker.model.language_model.embed_tokens.weight"
HEAD_KEY = "thinker.lm_head.weight"
EMBED_SCALE = 16.0
HEAD_GAIN = 14.0


def successor_permutation(ordinary_tokens: int, seed: int) -> torch.Tensor:
    """``succ[t]`` for the ordinary token ids ``0 .. ordinary_tokens - 1``."""
    return torch.randperm(ordinary_tokens, generator=torch.Generator().manual_seed(seed + 1))


@torch.no_grad()
def confident_head_(state: dict[str, torch.Tensor], ordinary_tokens: int, seed: int) -> None:
    """Rewrites ``state``'s thinker embedding and head in place (in their stored dtype)."""
    embed = state[EMBED_KEY].float() * EMBED_SCALE
    head = state[HEAD_KEY].float()
    if head.data_ptr() == state[EMBED_KEY].data_ptr():
        raise ValueError("a tied thinker head cannot be made confident: its rows are the embeddings")
    succ = successor_permutation(ordinary_tokens, seed)
    directions = embed[:ordinary_tokens] / embed[:ordinary_tokens].norm(dim=-1, keepdim=True).clamp_min(1e-6)
    # The final RMSNorm leaves states of norm ~sqrt(hidden) (its weight is 1 in a made checkpoint), so a row of
    # norm HEAD_GAIN / sqrt(hidden) along t's direction adds HEAD_GAIN * cos(state, e_t) logits to succ[t].
    head[succ] += directions * (HEAD_GAIN / head.shape[1] ** 0.5)
    state[EMBED_KEY] = embed.to(state[EMBED_KEY].dtype).contiguous()
    state[HEAD_KEY] = head.to(state[HEAD_KEY].dtype).contiguous()
