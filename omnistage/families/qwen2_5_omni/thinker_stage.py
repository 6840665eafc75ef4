"""The thinker engine's request for one Qwen2.5-Omni prompt (shared by the worker and the offline path).

A prompt with media goes in as embeddings (encoder features merged at the placeholder rows, encoded when the
request is built) with its TMRoPE positions; it is keyed for the prefix cache by its ids plus each item's digest
over its placeholder rows (:mod:`.media_keys`: an audio per 2 s encoder chunk), so two prompts share blocks only
where their media are identical. A prompt whose reply the talker speaks (``capture``) keeps every row's
last-layer hidden state (:class:`HiddenCapture`); rows served from the prefix cache come with theirs from the
step hook's cache beside the KV, which holds prompt rows only, so no request keys its generated rows.
"""

from __future__ import annotations

import torch

from omnistage.engine import Request
from omnistage.families.qwen2_5_omni.media_keys import MediaLayout, media_spans
from omnistage.families.qwen2_5_omni.thinker_hook import HiddenCapture
from omnistage.models.qwen2_5_omni.inputs import OmniInputs
from omnistage.models.qwen2_5_omni.thinker import Thinker
from omnistage.sampling_params import SamplingParams


def build_thinker_request(thinker: Thinker, request_id: str, token_ids: list[int], mm: OmniInputs,
                          params: SamplingParams, eos_token_id: int | None, *, capture: bool = False) -> Request:
    """``capture``: the prompt goes in as embeddings (the talker's rows are recorded by :class:`ThinkerHiddenHook`)."""
    ids = torch.tensor(token_ids, dtype=torch.long)
    positions, delta = thinker.positions(ids, mm)
    embeds = None
    if mm.has_media or capture:
        device = next(thinker.parameters()).device
        embeds = thinker.embed(ids.to(device), mm)
    spans = media_spans(token_ids, mm, MediaLayout.from_config(thinker.config))
    return Request(request_id, list(token_ids), params, prompt_embeds=embeds, prompt_positions=positions,
                   rope_delta=delta, eos_token_id=eos_token_id, mm_spans=spans,
                   stage_data=HiddenCapture() if capture else None, keys_outputs=False)
