"""Stage-specific behaviour around the generic autoregressive step.

The AR runner knows nothing about talkers: it asks its hook whether a request
may step, what embeddings to feed for already-generated positions, how to
mask logits, and what extra to compute after sampling. The default hook is a
plain language model (generated ids are fed back through the embedding table).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from omnistage.engine.config import EngineConfig
from omnistage.engine.request import Request
from omnistage.runner.base import ARModel
from omnistage.runner.cuda_graph import CaptureOutcome

if TYPE_CHECKING:
    from omnistage.runner.input_batch import StepInputs
    from omnistage.runner.sampler import Sampler, SamplingBatch


@dataclass
class OutputSpan:
    """Generated positions ``start:end`` (0 = first generated token) of ``request`` fed this step."""

    request: Request
    start: int
    end: int


class StepHook:
    # True when generated positions are fed as hook-made embeddings rather than as ids.
    feeds_output_embeds: bool = False
    # The CUDA graphs the hook captured in ``bind`` (the runner reports them with its own).
    capture_outcomes: tuple[CaptureOutcome, ...] = ()

    def bind(self, config: EngineConfig) -> None:
        """Called once by the runner, before any step and before it sizes its KV pool, with the engine's config
        (its ``num_blocks`` the configured count: a memory budget may size the pool otherwise)."""

    def slot_bytes(self, config: EngineConfig) -> int:
        """Bytes the hook keeps per KV slot (sized in :meth:`bind_pool`), counted with each block's KV when a
        memory budget sizes the pool."""
        return 0

    def bind_pool(self, num_blocks: int) -> None:
        """Called once the KV pool is sized (``num_blocks``, the null block included), before any step: a hook
        keeping state per KV slot sizes it here."""

    def is_ready(self, request: Request) -> bool:
        """False holds a running request out of this step (it keeps its blocks)."""
        return True

    def prepare(self, model: ARModel, inputs: StepInputs) -> None:
        """Called before the step's embeddings are gathered: a hook may fill in prompt rows it makes lazily."""

    def output_embeds(self, spans: list[OutputSpan]) -> torch.Tensor:
        """Input embeddings ``[sum of span lengths, H]`` for the spans, in order."""
        raise NotImplementedError("this hook feeds generated ids, not embeddings")

    def forward(self, model: ARModel, inputs: StepInputs, inputs_embeds: torch.Tensor | None) -> torch.Tensor:
        """Runs the model on the step (inside the forward context); a hook may pass extra model inputs
        or keep intermediate states."""
        return model.forward(inputs.input_ids, inputs.positions, inputs_embeds)

    def plain_forward(self, inputs: StepInputs) -> bool:
        """Whether this step's ``forward`` is exactly ``model.forward(ids, positions, embeds)``,
        the call a decode CUDA graph replays."""
        return True

    def process_logits(self, logits: torch.Tensor, requests: list[Request]) -> torch.Tensor:
        return logits

    def on_sampled(
        self, hidden_last: torch.Tensor, token_ids: torch.Tensor, requests: list[Request], sampler: Sampler,
        sampling: SamplingBatch,
    ) -> torch.Tensor | None:
        """Extra per-request rows made from the sampled ids (returned to the caller), or None. ``sampler`` and
        ``sampling`` (the rows' settings and generators) serve any further sampling the hook does."""
        return None
