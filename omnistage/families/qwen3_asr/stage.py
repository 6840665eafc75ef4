"""The recogniser engine's request for one Qwen3-ASR prompt, and one uncached pass over a whole prompt.

A prompt goes in as embeddings (the audio's features at its placeholder rows, encoded when the request is built)
with plain positions ``0..L-1``; it is keyed for the prefix cache by its ids plus the audio's SHA-256 digest over
its placeholder rows, so two prompts share blocks only up to where their audio differs (two requests with the
same context share their system turn). Both EOS ids stop it (``<|im_end|>`` as the engine's EOS, the other a stop
id).
"""

from __future__ import annotations

import msgspec
import torch

from omnistage.engine import Request
from omnistage.engine.request import MultimodalSpan
from omnistage.layers.attention import AttentionMetadata, ForwardContext, forward_context
from omnistage.models.media_items import item_digest
from omnistage.families.qwen3_asr.model import Qwen3ASR
from omnistage.runner.ar_runner import default_backend
from omnistage.sampling_params import SamplingParams


def build_request(model: Qwen3ASR, request_id: str, token_ids: list[int], mels: list[torch.Tensor],
                  params: SamplingParams) -> Request:
    device = next(model.parameters()).device
    ids = torch.tensor(token_ids, dtype=torch.long)
    embeds = model.embed(ids.to(device), mels) if mels else None
    eos = model.ckpt.eos_token_ids
    extra = tuple(t for t in eos[:-1] if t not in params.stop_token_ids)
    if extra and not params.ignore_eos:
        params = msgspec.structs.replace(params, stop_token_ids=params.stop_token_ids + extra)
    return Request(request_id, list(token_ids), params, prompt_embeds=embeds,
                   prompt_positions=torch.arange(len(token_ids)), eos_token_id=eos[-1],
                   mm_spans=_spans(ids, mels, model.ckpt.hf.audio_token_id), keys_outputs=False)


def _spans(ids: torch.Tensor, mels: list[torch.Tensor], audio_token: int) -> tuple[MultimodalSpan, ...]:
    """One span over the audio's placeholder rows, keyed by its mel frames' digest (one audio per prompt)."""
    rows = (ids == audio_token).nonzero().squeeze(1)
    if not mels or rows.numel() == 0:
        return ()
    return (MultimodalSpan(int(rows[0]), int(rows[-1]) + 1, item_digest("qwen3_asr.audio", mels)),)


@torch.no_grad()
def whole_prompt_hidden(model: Qwen3ASR, token_ids: list[int], mels: list[torch.Tensor]) -> torch.Tensor:
    """Final hidden states ``[L, H]`` of one prompt in one uncached pass (the aligner's forward; verify's logits)."""
    device = next(model.parameters()).device
    ids = torch.tensor(token_ids, dtype=torch.long, device=device)
    embeds = model.embed(ids, mels)
    meta = AttentionMetadata.for_fresh_sequences([len(token_ids)], device)
    with forward_context(ForwardContext(meta, default_backend(device), None)):
        return model(ids, torch.arange(len(token_ids), device=device), embeds)
