"""The thinker's step: deepstack visual features for prompt chunks, and hidden states kept for the talker.

A multimodal prompt arrives as merged embeddings plus deepstack features
(added to the visual rows after the first decoder layers). Prompts may be
chunked and batched, so each step cuts every request's chunk out of its
features and re-bases the rows onto the flattened batch. Requests that feed a
talker also keep the thinker's ``accept_hidden_layer`` states, one row per
computed position (recomputed positions after preemption are not stored twice).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, cast

import torch

from omnistage.engine.request import Request
from omnistage.models.qwen3_omni.decoder import Deepstack
from omnistage.runner.base import ARModel
from omnistage.runner.step_hook import StepHook

if TYPE_CHECKING:
    from omnistage.models.qwen3_omni.thinker import Thinker
    from omnistage.runner.input_batch import StepInputs


@dataclass
class ThinkerRequestData:
    """Per-request thinker state, set as ``Request.stage_data``."""

    deepstack: Deepstack | None = None  # rows relative to the prompt
    capture_hidden: bool = False
    accept_hidden: list[torch.Tensor] = field(default_factory=list)  # [k, H] chunks, in position order
    num_captured: int = 0

    def hidden_states(self) -> torch.Tensor:
        """``[num_captured, H]``: accept-layer hidden states of every position computed so far."""
        return torch.cat(self.accept_hidden)

    def record(self, start: int, rows: torch.Tensor) -> None:
        skip = self.num_captured - start  # positions recomputed after a preemption are already stored
        if skip < rows.shape[0]:
            self.accept_hidden.append(rows[max(skip, 0):].clone())
            self.num_captured = start + rows.shape[0]


def _data(request: Request) -> ThinkerRequestData | None:
    data = request.stage_data
    return data if isinstance(data, ThinkerRequestData) else None


class ThinkerStepHook(StepHook):
    def _deepstack(self, inputs: StepInputs) -> Deepstack | None:
        parts = []
        for t, request, start, end in inputs.embed_prompt:
            data = _data(request)
            if data is not None and data.deepstack is not None:
                parts.append((t, data.deepstack.select(start, end)))
        return Deepstack.concat(parts)

    @staticmethod
    def _captures(inputs: StepInputs) -> list[tuple[int, ThinkerRequestData, int, int]]:
        out = []
        for t, request, start, count in inputs.spans:
            data = _data(request)
            if data is not None and data.capture_hidden:
                out.append((t, data, start, count))
        return out

    def plain_forward(self, inputs: StepInputs) -> bool:
        return not self._captures(inputs) and self._deepstack(inputs) is None

    def forward(self, model: ARModel, inputs: StepInputs, inputs_embeds: torch.Tensor | None) -> torch.Tensor:
        thinker = cast("Thinker", model)  # deepstack and accept-layer capture are thinker-only inputs
        deepstack = self._deepstack(inputs)
        captures = self._captures(inputs)
        if not captures:
            return thinker.forward(inputs.input_ids, inputs.positions, inputs_embeds, deepstack=deepstack)
        hidden, accept = thinker.forward_with_accept_hidden(
            inputs.input_ids, inputs.positions, inputs_embeds, deepstack)
        for t, data, start, count in captures:
            data.record(start, accept[t:t + count])
        return hidden
