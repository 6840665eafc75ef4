"""Decode-step CUDA graphs at bucketed batch sizes (1, 2, 4, 8, then every 16), padded at replay.

Graphs replay fixed shapes, so every captured step attends over the full
block-table width (``max_model_len``) and masks by the per-row context length
held in a static buffer. Padded rows write their keys/values into the null
block (slot -1 → block 0) and read a context of one token, so they never touch
a real request's cache. All graphs share one memory pool, largest captured
first. Shapes not captured (prefill, mixed, or larger batches) run eagerly.

A capture that fails leaves the stage eager and says so: a warning in the log, a :class:`CaptureOutcome` the
replica reports on ``/metrics`` (``omnistage_cuda_graphs_captured``, ``omnistage_cuda_graph_capture_failures``)
and ``scripts/gpu_check.sh`` writes into its JSON, so eager figures are never taken for graph ones.
"""

from __future__ import annotations

import bisect
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from omnistage.layers.attention.base import AttentionMetadata
from omnistage.layers.attention.context import ForwardContext, forward_context

if TYPE_CHECKING:
    from omnistage.runner.ar_runner import ARModelRunner
    from omnistage.runner.input_batch import StepInputs

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class CaptureOutcome:
    """What became of one set of CUDA graphs at start-up."""

    graphs: str  # which set: "decode", "code predictor"
    captured: bool
    error: str = ""  # why the capture failed ("" when captured)


def capture_or_eager(graphs: str, capture: Callable[[], None]) -> CaptureOutcome:
    """Runs ``capture``; a failure is logged at warning and returned (the stage then runs eagerly)."""
    try:
        capture()
    except Exception as exc:  # a host sync in the model, an out-of-memory, a kernel that cannot be captured
        error = f"{type(exc).__name__}: {exc}"
        logger.warning("%s CUDA graph capture failed (%s); running eagerly", graphs, error)
        return CaptureOutcome(graphs, False, error)
    return CaptureOutcome(graphs, True)


def describe(outcomes: Iterable[CaptureOutcome]) -> str:
    """One line for logs and reports: ``decode: captured; code predictor: FAILED (RuntimeError: ...)``."""
    parts = [f"{o.graphs}: " + ("captured" if o.captured else f"FAILED ({o.error})") for o in outcomes]
    return "; ".join(parts) or "eager (no graphs asked for)"


def graph_batch_sizes(max_batch: int) -> list[int]:
    sizes = [b for b in (1, 2, 4, 8) if b <= max_batch]
    return sizes + list(range(16, max_batch + 1, 16))


class CudaGraphRunner:
    def __init__(self, runner: ARModelRunner) -> None:
        config = runner.config
        self.runner = runner
        self.sizes = graph_batch_sizes(min(config.cuda_graph_max_batch, config.max_num_seqs))
        max_bs, width = self.sizes[-1], config.max_blocks_per_seq
        self.context_width = width * config.block_size
        dev = runner.device
        self.input_ids = torch.zeros(max_bs, dtype=torch.int64, device=dev)
        self.positions = torch.zeros((3, max_bs) if runner.mrope else (max_bs,), dtype=torch.int64, device=dev)
        self.slot_mapping = torch.full((max_bs,), -1, dtype=torch.int64, device=dev)
        self.context_lens = torch.ones(max_bs, dtype=torch.int32, device=dev)
        self.query_start_loc = torch.arange(max_bs + 1, dtype=torch.int32, device=dev)
        self.block_tables = torch.zeros(max_bs, width, dtype=torch.int32, device=dev)
        self.embeds: torch.Tensor | None = None
        if runner.hook.feeds_output_embeds:
            hidden = runner.model.embed_tokens(self.input_ids[:1]).shape[-1]
            self.embeds = torch.zeros(max_bs, hidden, dtype=config.dtype, device=dev)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, torch.Tensor] = {}

    @classmethod
    def try_capture(cls, runner: ARModelRunner) -> tuple[CudaGraphRunner | None, CaptureOutcome]:
        """Captures all sizes; None (eager) with the failure when the model cannot be captured."""
        graphs = cls(runner)
        outcome = capture_or_eager("decode", graphs.capture)
        return (graphs if outcome.captured else None), outcome

    def _meta(self, bs: int) -> AttentionMetadata:
        return AttentionMetadata(
            query_start_loc=self.query_start_loc[:bs + 1], context_lens=self.context_lens[:bs],
            slot_mapping=self.slot_mapping[:bs], block_tables=self.block_tables[:bs],
            query_lens=[1] * bs, context_lens_cpu=[self.context_width] * bs,
        )

    def _forward(self, bs: int) -> torch.Tensor:
        runner = self.runner
        positions = self.positions[..., :bs]
        embeds = None if self.embeds is None else self.embeds[:bs]
        with forward_context(ForwardContext(self._meta(bs), runner.backend, runner.kv_caches)):
            return runner.model.forward(self.input_ids[:bs], positions, embeds)

    @torch.inference_mode()
    def capture(self) -> None:
        pool = None
        for bs in reversed(self.sizes):
            for _ in range(2):  # warm-up: lazy inits and allocator growth happen outside capture
                self._forward(bs)
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                self.outputs[bs] = self._forward(bs)
            pool = graph.pool() if pool is None else pool
            self.graphs[bs] = graph
        torch.cuda.synchronize()

    def can_run(self, inputs: StepInputs, embeds: torch.Tensor | None) -> bool:
        meta = inputs.meta
        return (meta.is_decode_only and meta.num_seqs <= self.sizes[-1]
                and (embeds is None) == (self.embeds is None) and self.runner.hook.plain_forward(inputs))

    def run(self, inputs: StepInputs, embeds: torch.Tensor | None) -> torch.Tensor:
        meta = inputs.meta
        n = meta.num_seqs
        bs = self.sizes[bisect.bisect_left(self.sizes, n)]
        self.input_ids[:n].copy_(inputs.input_ids)
        self.positions[..., :n].copy_(inputs.positions)
        self.slot_mapping[:n].copy_(meta.slot_mapping)
        self.slot_mapping[n:bs].fill_(-1)
        self.context_lens[:n].copy_(meta.context_lens)
        self.context_lens[n:bs].fill_(1)
        # Columns past this step's width keep stale ids; the context-length mask hides them.
        self.block_tables[:n, :meta.block_tables.shape[1]].copy_(meta.block_tables)
        if embeds is not None and self.embeds is not None:
            self.embeds[:n].copy_(embeds)
        self.graphs[bs].replay()
        return self.outputs[bs][:n]
