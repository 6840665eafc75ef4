"""A random Qwen3-TTS talker made to pick its codes with a trained model's margins, in memory, for measuring
how often quantization changes a greedy code (``bench quant --stage tts-talker``).

A random checkpoint's logits are close to flat, so any perturbation (int8 weights, another kernel order) flips
greedy codes far more often than in a trained model, whose top code usually leads by several logits. As
:mod:`omnistage.tiny.confident_head` does for the thinker, this scales each input embedding up (``EMBED_SCALE``)
so the input code's direction survives to the final state, and gives each head, for a fixed random permutation
``succ`` of the ordinary codes, a row for ``succ[c]`` along the direction in which code ``c`` enters
(``HEAD_GAIN`` times the head's own logit spread at cosine 1: made checkpoints draw wide heads, whose logits
spread ~0.5 sqrt(hidden), so a fixed gain would drown in them): a bigram "after c comes succ[c]" that the layers
can still override.

* the code predictor's pass ``s`` (head ``s``) sees code ``s`` (code 0: the talker's embedding of it; code
  ``s >= 1``: the predictor's embedding ``s - 1``) through ``small_to_mtp_projection``;
* the talker's codec head sees the frame's summed embeddings, of which code 0's is one of 16.

Codec specials (ids at and above the code predictor's vocabulary) are never a successor. Only embeddings and
heads change: the layers that quantization touches keep their random weights.
"""

from __future__ import annotations

import torch
from torch import nn

from omnistage.models.qwen3_tts.talker import Qwen3TTSTalker

EMBED_SCALE = 16.0
HEAD_GAIN = 4.0  # standard deviations of the head's logits


def _lean_(head: nn.Linear, inputs: torch.Tensor, generator: torch.Generator) -> None:
    """``head``'s row ``succ[c]`` gains ``HEAD_GAIN`` logit spreads at cosine 1 with input row ``c`` (``inputs
    [C, H]``). The final RMSNorm leaves states of norm ~sqrt(H) (weight 1 in a made checkpoint), so a row's logits
    spread as its entries' deviation times sqrt(H)."""
    codes = inputs.shape[0]
    succ = torch.randperm(codes, generator=generator)
    directions = inputs.float() / inputs.float().norm(dim=-1, keepdim=True).clamp_min(1e-6)
    rows = head.weight.detach().float()
    spread = float(rows.std()) * rows.shape[1] ** 0.5
    rows[succ] += directions * (HEAD_GAIN * spread / rows.shape[1] ** 0.5)
    head.weight.data.copy_(rows.to(head.weight.dtype))


@torch.no_grad()
def confident_talker_(talker: Qwen3TTSTalker, seed: int = 0) -> None:
    """Rewrites ``talker``'s code embeddings and heads in place (before any quantization)."""
    generator = torch.Generator().manual_seed(seed + 1)
    predictor = talker.code_predictor
    codes = talker.residual_vocab_size
    talker.model.codec_embedding.weight.mul_(EMBED_SCALE)
    for embedding in predictor.model.codec_embedding:
        embedding.weight.mul_(EMBED_SCALE)
    entering = [talker.model.codec_embedding.weight[:codes]]
    entering += [e.weight[:codes] for e in predictor.model.codec_embedding]
    for head, embedded in zip(predictor.lm_head, entering):
        _lean_(head, predictor.small_to_mtp_projection(embedded), generator)
    _lean_(talker.codec_head, talker.model.codec_embedding.weight[:codes], generator)
