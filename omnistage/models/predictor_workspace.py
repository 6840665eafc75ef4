"""The lockstep code predictor's loop state, shared by every family's code predictor.

A code predictor fills residual codebooks 1..G-1 of N frames at once: G - 1 short passes in lockstep, frame i
owning row i of a contiguous cache (:class:`omnistage.layers.attention.dense.LockstepBackend`). The workspace
keeps its caches, attention metadata, positions and rotary angles across calls, and sampling is a tensor-only
:class:`CodeSampler`, so the whole loop allocates nothing it can keep and captures in one CUDA graph per size.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from omnistage.layers.attention.base import AttentionMetadata
from omnistage.layers.attention.context import ForwardContext, forward_context
from omnistage.layers.attention.dense import LockstepBackend, LockstepViews
from omnistage.layers.rotary import Rotation
from omnistage.models.decoder import Decoder, DecoderConfig
from omnistage.models.lockstep_stack import LockstepStack


class CodeSampler(Protocol):
    """Picks residual codes: ``sample(logits [N, vocab], step)`` → ids ``[N]`` for codebook ``step + 1``.
    Implementations keep to tensors (no host sync), so a CUDA graph can record the loop that calls them."""

    def sample(self, logits: torch.Tensor, step: int) -> torch.Tensor: ...


class GreedyCodes:
    def sample(self, logits: torch.Tensor, step: int) -> torch.Tensor:
        return logits.argmax(dim=-1)



@dataclass
class _Step:
    meta: AttentionMetadata
    positions: torch.Tensor
    rotation: Rotation


class PredictorPasses:
    """One predict call's passes over ``n`` frames (:meth:`PredictorWorkspace.passes`)."""

    def __init__(self, workspace: PredictorWorkspace, decoder: Decoder, n: int, caches: list[torch.Tensor],
                 stack: LockstepStack | None) -> None:
        self.workspace, self.decoder, self.n, self.caches, self.stack = workspace, decoder, n, caches, stack
        self.weights = stack.weights() if stack is not None else None

    def run(self, x: torch.Tensor, step: int) -> torch.Tensor:
        """Pass ``step`` (its new rows ``x [n * new, H]``: hidden then code 0 at step 0, one code after) ->
        the final normed hidden of each frame's last row ``[n, H]``."""
        plan = self.workspace.step(self.n, step, x.device, self.decoder)
        if self.stack is not None and self.weights is not None:
            views = self.workspace.views(self.n, step, plan.meta)
            hidden = self.stack.forward(x, plan.rotation, self.weights, views)
        else:
            with forward_context(ForwardContext(plan.meta, self.workspace.backend, self.caches)):
                hidden, _ = self.decoder(x, plan.positions, rotation=plan.rotation)
        return hidden.view(self.n, plan.meta.query_lens[0], -1)[:, -1]


class PredictorWorkspace:
    """Buffers of the predict loop, kept across calls: per-layer caches ``[2, N_max, G, Hkv, D]`` (grown to the
    largest N seen; rows are overwritten from position 0 each call, so they are never cleared), each
    ``(N, step)``'s attention metadata, positions and rotary angles, and the cache views of its passes."""

    def __init__(self, cfg: DecoderConfig, num_groups: int) -> None:
        self.cfg, self.num_groups = cfg, num_groups
        self.backend = LockstepBackend()
        self.caches: list[torch.Tensor] = []
        self._views: dict[tuple[int, int], list[LockstepViews]] = {}
        # Caches (and views of them, with their masks) replaced by larger ones stay alive: a CUDA graph captured
        # on them still reads and writes there.
        self._retired: list[object] = []
        self._steps: dict[tuple[int, int], _Step] = {}
        self._stack: LockstepStack | None = None

    def passes(self, decoder: Decoder, n: int, like: torch.Tensor) -> PredictorPasses:
        """The passes of one predict call over ``n`` frames (``like``: a tensor of the loop's device and dtype):
        through :class:`LockstepStack` when it covers ``decoder``, else through the decoder's forward."""
        stack = None
        if LockstepStack.supports(decoder):
            if self._stack is None or self._stack.decoder is not decoder:
                self._stack = LockstepStack(decoder)
            stack = self._stack
        return PredictorPasses(self, decoder, n, self.kv_caches(n, like), stack)

    def kv_caches(self, n: int, like: torch.Tensor) -> list[torch.Tensor]:
        if not self.caches or self.caches[0].shape[1] < n or self.caches[0].device != like.device \
                or self.caches[0].dtype != like.dtype:
            if self.caches:
                self._retired.append((self.caches, self._views))
                self._views = {}
            shape = (2, max(n, 8), self.num_groups, self.cfg.num_kv_heads, self.cfg.head_dim)
            self.caches = [like.new_zeros(shape) for _ in range(self.cfg.num_layers)]
        return self.caches

    def views(self, n: int, step: int, meta: AttentionMetadata) -> list[LockstepViews]:
        """Each layer's cache views for pass ``step`` over ``n`` frames."""
        key = (n, step)
        views = self._views.get(key)
        if views is None:
            new, end = meta.query_lens[0], meta.context_lens_cpu[0]
            views = self._views[key] = [LockstepViews.of(cache, n, new, end) for cache in self.caches]
        return views

    def step(self, n: int, step: int, device: torch.device, decoder: Decoder) -> _Step:
        """Step 0 adds the talker hidden and code 0 (2 tokens), every later step one code."""
        key = (n, step)
        cached = self._steps.get(key)
        if cached is None or cached.positions.device != device:
            num_new, context = (2 if step == 0 else 1), step + 2
            meta = AttentionMetadata(
                query_start_loc=torch.arange(n + 1, device=device, dtype=torch.int32) * num_new,
                context_lens=torch.full((n,), context, device=device, dtype=torch.int32),
                slot_mapping=torch.empty(0, dtype=torch.int64, device=device),  # lockstep: rows, not slots
                block_tables=None, query_lens=[num_new] * n, context_lens_cpu=[context] * n,
            )
            positions = torch.arange(context - num_new, context, device=device).repeat(n)
            cached = self._steps[key] = _Step(meta, positions, decoder.rotation(positions))
        return cached
