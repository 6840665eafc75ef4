"""The thinker's step for a reply the talker speaks: the last-layer hidden state of every computed row kept.

A capturing request (``Request.stage_data`` a :class:`HiddenCapture`) is never served from the prefix cache, so
every one of its positions is computed; positions recomputed after a preemption are not stored twice. The worker
drains what was captured with each of the request's outputs (:meth:`HiddenCapture.drain`); how the rows are
kept is the runner's :class:`HiddenCapture`, shared with Qwen3-Omni's thinker hook.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from omnistage.engine.request import Request
from omnistage.runner.hidden_capture import HiddenCapture
from omnistage.runner.base import ARModel
from omnistage.runner.step_hook import StepHook

if TYPE_CHECKING:
    from omnistage.runner.input_batch import StepInputs


def _capture(request: Request) -> HiddenCapture | None:
    data = request.stage_data
    return data if isinstance(data, HiddenCapture) else None


class ThinkerHiddenHook(StepHook):
    def plain_forward(self, inputs: StepInputs) -> bool:
        return not any(_capture(request) for _, request, _, _ in inputs.spans)

    def forward(self, model: ARModel, inputs: StepInputs, inputs_embeds: torch.Tensor | None) -> torch.Tensor:
        hidden = model.forward(inputs.input_ids, inputs.positions, inputs_embeds)
        for t, request, start, count in inputs.spans:
            data = _capture(request)
            if data is not None:
                data.record(start, hidden[t:t + count])
        return hidden
