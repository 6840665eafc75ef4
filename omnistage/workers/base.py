"""What a stage replica's loop drives: a ``StageWorker`` turning stage inputs into stage outputs.

A worker owns one stage engine (a family's thinker, talker, codec decoder, or
a test fake). The replica loop (:mod:`omnistage.pipeline.replica`) feeds it
every input that arrived, steps it while it has work, and ships what it
returns; the worker never touches sockets, threads or processes. Which worker a
stage runs is the stage YAML's ``model:`` name resolved through the family
registry (:class:`WorkerSpec.worker`), imported inside the replica.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

import torch

from omnistage.config.pipeline import StageSpec
from omnistage.importing import resolve
from omnistage.engine import EngineConfig, EngineCore, RequestOutput
from omnistage.engine.config import auto_device, kv_cache_dtype_named
from omnistage.ipc.messages import ReplicaLoad, RequestFailed, StageInput, StageOutput


@dataclass
class StepResult:
    outputs: list[StageOutput | RequestFailed] = field(default_factory=list)
    # False when the step scheduled nothing (every request waits on input): the loop then blocks on input.
    progressed: bool = True


class StageWorker(ABC):
    @abstractmethod
    def handle(self, message: StageInput) -> list[StageOutput | RequestFailed]:
        """Applies one input (start a request, feed it, decode a chunk); returns outputs it made at once."""

    @abstractmethod
    def abort(self, request_ids: list[str]) -> None:
        """Frees these requests (unknown ids are ignored: aborts race with natural finishes)."""

    @abstractmethod
    def has_work(self) -> bool:
        """Whether any request is unfinished here."""

    @abstractmethod
    def step(self) -> StepResult: ...

    @abstractmethod
    def load(self) -> ReplicaLoad: ...

    @abstractmethod
    def request_ids(self) -> list[str]:
        """Requests held here (failed together when a step raises)."""

    def close(self) -> None:
        """Releases what outlives the replica's loop otherwise (a tensor-parallel stage's other ranks)."""

    def scheduled_ids(self) -> list[str]:
        """The requests the last step computed for (read only when tracing: each request's queue wait ends at its
        first); empty when the worker does not say, and its spans then show no queue wait."""
        return []

    def step_profile(self) -> dict[int, float]:
        """Seconds of one decode step by batch size, measured once before serving (the replica sends it in its
        ``ReplicaReady``); empty for a stage whose cost per stream the admission gate does not need."""
        return {}


# Builds a replica's worker inside the replica (after the process started); must pickle for ``spawn``.
WorkerFactory = Callable[[], StageWorker]


@dataclass(frozen=True)
class WorkerSpec:
    """How to build one replica's worker (picklable: it crosses into the spawned process).

    worker: ``"package.module:Class"``, the class the stage's ``model:`` name resolves to (a ``StageWorker``
    taking this spec); imported in the replica, so the orchestrator's process never loads model code.
    """

    model_dir: str
    stage: StageSpec
    worker: str = ""  # empty when the worker class is built directly (tests)
    seamless_audio: bool = True


def build_worker(spec: WorkerSpec) -> StageWorker:
    """The replica's worker factory (a module-level function, so ``partial(build_worker, spec)`` pickles)."""
    cls = resolve(spec.worker)
    return cls(spec)


def resolve_device(device: str, dtype: str = "auto") -> tuple[str, torch.dtype]:
    device = auto_device(device)
    if dtype != "auto":
        return device, getattr(torch, dtype)
    # bf16 is what the checkpoints ship in; on CPU fp32 is faster and exact.
    return device, (torch.bfloat16 if device.startswith("cuda") else torch.float32)


def engine_config(stage: StageSpec, device: str, dtype: torch.dtype, max_positions: int) -> EngineConfig:
    e = stage.engine
    return EngineConfig(
        block_size=e.block_size, num_blocks=e.num_kv_blocks + 1,  # + the reserved null block
        max_num_seqs=e.max_num_seqs, max_num_batched_tokens=e.max_num_batched_tokens,
        max_model_len=e.model_len(max_positions),
        enable_prefix_caching=e.enable_prefix_caching, device=device, dtype=dtype,
        kv_cache_memory=e.kv_cache_memory, gpu_memory_utilization=e.gpu_memory_utilization,
        kv_cache_dtype=kv_cache_dtype_named(e.kv_cache_dtype),
    )


def kv_load(engine: EngineCore) -> ReplicaLoad:
    sched = engine.scheduler
    total = sched.kv.usable_blocks
    graphs = getattr(engine.runner, "capture_outcomes", ())  # a runner without graphs (tests' fakes) has none
    return ReplicaLoad(waiting=len(sched.waiting), running=len(sched.running),
                       kv_blocks_used=total - sched.kv.num_free_blocks, kv_blocks_total=total,
                       kv_block_bytes=getattr(engine.runner, "kv_block_bytes", 0),
                       graphs_captured=sum(o.captured for o in graphs),
                       graph_capture_failures=sum(not o.captured for o in graphs))


_Held = TypeVar("_Held")


class ARWorker(StageWorker, Generic[_Held]):
    """An autoregressive stage: an ``EngineCore`` and what it holds per request."""

    def __init__(self, engine: EngineCore) -> None:
        self.engine = engine
        self.requests: dict[str, _Held] = {}

    def abort(self, request_ids: list[str]) -> None:
        for rid in request_ids:
            self.engine.abort_request(rid)
            self.requests.pop(rid, None)

    def has_work(self) -> bool:
        return self.engine.has_unfinished_requests()

    def load(self) -> ReplicaLoad:
        return kv_load(self.engine)

    def request_ids(self) -> list[str]:
        return list(self.requests)

    def failed(self, out: RequestOutput) -> RequestFailed:
        """A request the engine ended alone with an error (the engine already freed it)."""
        self.requests.pop(out.request_id, None)
        return RequestFailed(out.request_id, out.error or "the stage failed this request")

    def progressed(self) -> bool:
        return self.engine.last_num_scheduled > 0

    def scheduled_ids(self) -> list[str]:
        sched = self.engine.last_schedule
        return [s.request.request_id for s in sched.scheduled] if sched is not None else []

