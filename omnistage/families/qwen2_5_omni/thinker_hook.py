"""The thinker's step for a reply the talker speaks: the last-layer hidden state of every prompt row kept.

A capturing request (``Request.stage_data`` a :class:`HiddenCapture`) records every row it computes; positions
recomputed after a preemption are not stored twice. With prefix caching on, every step that computes prompt rows
also writes their states to a :class:`HiddenStateCache` beside the KV cache (the thinker's requests key their
prompt rows only, ``Request.keys_outputs`` False, so every keyed block has its states), and a capturing request
served partly from the cache reads its cached rows' states there. The worker drains what was captured with each of
the request's outputs (:meth:`HiddenCapture.drain`); how the rows are kept is the runner's :class:`HiddenCapture`,
shared with Qwen3-Omni's thinker hook.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from omnistage.engine.request import Request
from omnistage.runner.base import ARModel
from omnistage.runner.hidden_cache import HiddenCacheHook
from omnistage.runner.hidden_capture import HiddenCapture

if TYPE_CHECKING:
    from omnistage.runner.input_batch import StepInputs


def _capture(request: Request) -> HiddenCapture | None:
    data = request.stage_data
    return data if isinstance(data, HiddenCapture) else None


class ThinkerHiddenHook(HiddenCacheHook):
    def _keeps_hidden(self, inputs: StepInputs) -> bool:
        """Whether this step computes prompt rows a later request may find in the prefix cache."""
        return self.hidden_cache is not None and any(
            request.prefix_cacheable and start < request.num_prompt_tokens for _, request, start, _ in inputs.spans)

    def plain_forward(self, inputs: StepInputs) -> bool:
        return not self._keeps_hidden(inputs) and not any(_capture(request) for _, request, _, _ in inputs.spans)

    def forward(self, model: ARModel, inputs: StepInputs, inputs_embeds: torch.Tensor | None) -> torch.Tensor:
        hidden = model.forward(inputs.input_ids, inputs.positions, inputs_embeds)
        # Written before the reads below: a request may hit blocks that another one fills in this same step.
        if self.hidden_cache is not None and self._keeps_hidden(inputs):
            self.hidden_cache.write(inputs.meta.slot_mapping, hidden)
        for i, (t, request, start, count) in enumerate(inputs.spans):
            data = _capture(request)
            if data is None:
                continue
            if data.num_captured < start:  # positions served from the prefix cache
                data.record(data.num_captured, self._cached(inputs, i, data.num_captured, start))
            data.record(start, hidden[t:t + count])
        return hidden

    def _cached(self, inputs: StepInputs, index: int, start: int, end: int) -> torch.Tensor:
        if self.hidden_cache is None:
            raise RuntimeError("a capturing request skipped positions, but no hidden states are cached")
        return self.hidden_cache.read(inputs.meta.block_tables[index], start, end)
