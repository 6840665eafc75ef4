"""The thinker engine's request for one Qwen2.5-Omni prompt (shared by the worker and the offline path).

A prompt with media goes in as embeddings (encoder features merged at the placeholder rows, encoded when the
request is built) with its TMRoPE positions; it is keyed for the prefix cache by its ids plus one digest of all
its encoder inputs over the stretch from its first to its last placeholder, so two prompts share blocks only
where their media are identical. A prompt whose reply the talker speaks (``capture``) keeps every row's
last-layer hidden state (:class:`HiddenCapture`) and so is never served from the prefix cache.
"""

from __future__ import annotations

import hashlib

import torch

from omnistage.engine import Request
from omnistage.engine.request import MultimodalSpan
from omnistage.families.qwen2_5_omni.thinker_hook import HiddenCapture
from omnistage.models.qwen2_5_omni.inputs import OmniInputs
from omnistage.models.qwen2_5_omni.thinker import Thinker
from omnistage.sampling_params import SamplingParams


def build_thinker_request(thinker: Thinker, request_id: str, token_ids: list[int], mm: OmniInputs,
                          params: SamplingParams, eos_token_id: int | None, *, capture: bool = False) -> Request:
    """``capture``: run with :class:`ThinkerHiddenHook`; the prompt goes in as embeddings with no ``mm_spans``
    (not prefix-cacheable: the talker needs every prompt row's state)."""
    ids = torch.tensor(token_ids, dtype=torch.long)
    positions, delta = thinker.positions(ids, mm)
    embeds = None
    if mm.has_media or capture:
        device = next(thinker.parameters()).device
        embeds = thinker.embed(ids.to(device), mm)
    spans = None if capture else media_spans(token_ids, mm, thinker)
    return Request(request_id, list(token_ids), params, prompt_embeds=embeds, prompt_positions=positions,
                   rope_delta=delta, eos_token_id=eos_token_id, mm_spans=spans,
                   stage_data=HiddenCapture() if capture else None)


def media_spans(token_ids: list[int], mm: OmniInputs, thinker: Thinker) -> tuple[MultimodalSpan, ...] | None:
    """One span over every media row with a digest of all encoder inputs; () without media."""
    if not mm.has_media:
        return ()
    rows = [i for i, t in enumerate(token_ids) if t in thinker.media_tokens]
    if not rows:
        return None  # media without placeholders: never shared (the embed call will refuse it anyway)
    return (MultimodalSpan(rows[0], rows[-1] + 1, _digest(mm)),)


def _digest(mm: OmniInputs) -> bytes:
    h = hashlib.sha256(b"qwen2_5_omni" + bytes([mm.use_audio_in_video]))
    for name in mm.__struct_fields__:
        value = getattr(mm, name)
        if isinstance(value, torch.Tensor):
            t = value.detach().contiguous().cpu()
            h.update(f"{name}{t.dtype}{tuple(t.shape)}".encode())
            h.update(t.view(-1).view(torch.uint8).numpy().tobytes())
    return h.digest()
