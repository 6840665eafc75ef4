"""The thinker's step: deepstack visual features for prompt chunks, and hidden states kept for the talker.

A multimodal prompt arrives as token embeddings plus its items' encoder
inputs (:class:`PromptMedia`); before a step computes prompt rows, the items
overlapping them are encoded into the embeddings and deepstack features
(added to the visual rows after the first decoder layers), so items served
whole from the prefix cache are never encoded. Prompts may be chunked and
batched, so each step cuts every request's chunk out of its features and
re-bases the rows onto the flattened batch (a prompt resumed after a
prefix-cache hit gets only its uncached rows' features: the cached rows'
deepstack part is already in their KV). Requests that feed a talker also
keep the thinker's ``accept_hidden_layer`` states, one row per computed
position (recomputed positions after preemption are not stored twice); with
prefix caching on, the states of positions served from the cache come from a
:class:`HiddenStateCache` beside the KV cache.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, cast

import torch

from omnistage.engine.request import Request
from omnistage.models.decoder import Deepstack
from omnistage.models.qwen3_omni.prompt_media import PromptMedia, encode_needed
from omnistage.runner.base import ARModel
from omnistage.runner.hidden_cache import HiddenCacheHook
from omnistage.runner.hidden_capture import HiddenCapture

if TYPE_CHECKING:
    from omnistage.models.qwen3_omni.thinker import Thinker
    from omnistage.runner.input_batch import StepInputs


@dataclass
class ThinkerRequestData:
    """Per-request thinker state, set as ``Request.stage_data``."""

    media: PromptMedia | None = None  # the prompt's items, encoded as steps reach them (with their deepstack)
    deepstack: Deepstack | None = None  # or deepstack features given whole, rows relative to the prompt
    capture_hidden: bool = False
    # Accept-layer states of every computed position: rows served from the prefix cache are exact at multimodal
    # positions (the ones the talker reads), not necessarily elsewhere.
    hidden: HiddenCapture = field(default_factory=HiddenCapture)


def _data(request: Request) -> ThinkerRequestData | None:
    data = request.stage_data
    return data if isinstance(data, ThinkerRequestData) else None


# A capturing request's share of a step: (its index in the step, flat start, its data, first position, count).
_Capture = tuple[int, int, ThinkerRequestData, int, int]


class ThinkerStepHook(HiddenCacheHook):
    def prepare(self, model: ARModel, inputs: StepInputs) -> None:
        needs = [(data.media, start, end) for _, request, start, end in inputs.embed_prompt
                 if (data := _data(request)) is not None and data.media is not None]
        if needs:
            encode_needed(cast("Thinker", model), needs)

    def _deepstack(self, inputs: StepInputs) -> Deepstack | None:
        parts = []
        for t, request, start, end in inputs.embed_prompt:
            data = _data(request)
            if data is not None and data.media is not None:
                parts.append((t, data.media.deepstack(start, end)))
            elif data is not None and data.deepstack is not None:
                parts.append((t, data.deepstack.select(start, end)))
        return Deepstack.concat(parts)

    @staticmethod
    def _captures(inputs: StepInputs) -> list[_Capture]:
        out = []
        for i, (t, request, start, count) in enumerate(inputs.spans):
            data = _data(request)
            if data is not None and data.capture_hidden:
                out.append((i, t, data, start, count))
        return out

    def _keeps_hidden(self, inputs: StepInputs) -> bool:
        """Whether this step computes multimodal prompt rows whose states a later prefix hit may need."""
        return self.hidden_cache is not None and any(
            request.prefix_cacheable and request.mm_spans_in(start, end)
            for _, request, start, end in inputs.embed_prompt)

    def plain_forward(self, inputs: StepInputs) -> bool:
        return not self._captures(inputs) and self._deepstack(inputs) is None and not self._keeps_hidden(inputs)

    def forward(self, model: ARModel, inputs: StepInputs, inputs_embeds: torch.Tensor | None) -> torch.Tensor:
        thinker = cast("Thinker", model)  # deepstack and accept-layer capture are thinker-only inputs
        deepstack = self._deepstack(inputs)
        captures = self._captures(inputs)
        keep = self._keeps_hidden(inputs)
        if not captures and not keep:
            return thinker.forward(inputs.input_ids, inputs.positions, inputs_embeds, deepstack=deepstack)
        hidden, accept = thinker.forward_with_accept_hidden(
            inputs.input_ids, inputs.positions, inputs_embeds, deepstack)
        # Written before the reads below: a request may hit blocks that another one fills in this same step.
        if keep and self.hidden_cache is not None:
            self.hidden_cache.write(inputs.meta.slot_mapping, accept)
        for i, t, data, start, count in captures:
            kept = data.hidden
            if kept.num_captured < start:  # positions served from the prefix cache
                kept.record(kept.num_captured, self._cached_hidden(inputs, i, kept.num_captured, start))
            kept.record(start, accept[t:t + count])
        return hidden

    def _cached_hidden(self, inputs: StepInputs, index: int, start: int, end: int) -> torch.Tensor:
        if self.hidden_cache is None:
            raise RuntimeError("a capturing request skipped positions, but no hidden states are cached")
        return self.hidden_cache.read(inputs.meta.block_tables[index], start, end)
