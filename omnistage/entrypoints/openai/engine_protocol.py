"""What the HTTP layer needs from the pipeline, and the typed reports it reads back.

The server is written against ``OmniEngine`` only; the real implementation is
``omnistage.pipeline.async_omni.AsyncOmni`` and the tests use a fake. Reports
are frozen dataclasses rather than dicts so both sides agree on every field.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from omnistage.config.generation_defaults import SamplingDefaults
from omnistage.core import OmniOutput, OmniRequest
from omnistage.processing.prompt import PromptProcessor


@dataclass(frozen=True)
class ReplicaHealth:
    """One replica of one stage; ``detail`` says why it is unhealthy (empty when healthy)."""

    replica: int
    healthy: bool
    detail: str = ""
    kv_blocks_total: int = 0  # the replica's KV pool (0 without a KV cache, or before it reported)
    kv_cache_bytes: int = 0


@dataclass(frozen=True)
class StageHealth:
    stage: str  # "thinker", "talker", "code2wav"
    replicas: tuple[ReplicaHealth, ...]

    @property
    def healthy(self) -> bool:
        # A stage serves while any replica does; the orchestrator routes around the others.
        return any(r.healthy for r in self.replicas)


@dataclass(frozen=True)
class HealthReport:
    stages: tuple[StageHealth, ...]

    @property
    def healthy(self) -> bool:
        return bool(self.stages) and all(s.healthy for s in self.stages)


@dataclass(frozen=True)
class ReplicaStats:
    """A snapshot of one stage replica's load, read at each /metrics scrape."""

    stage: str
    replica: int
    kv_blocks_used: int  # 0/0 for stages without a KV cache (code2wav)
    kv_blocks_total: int
    queue_depth: int  # requests waiting to be scheduled
    running: int  # requests scheduled
    kv_cache_bytes: int = 0  # memory the KV pool holds (null block included)


@dataclass(frozen=True)
class EngineStats:
    replicas: tuple[ReplicaStats, ...]
    shm_segments: int = 0  # shared-memory tensors written by one stage and not yet taken by the next


@runtime_checkable
class OmniEngine(Protocol):
    """The pipeline as the server sees it.

    ``generate`` yields deltas of one request (text and/or a float32 24 kHz audio
    chunk); the last has ``finished=True``. If the consumer stops early the server
    calls ``abort`` (shielded from cancellation) and then closes the iterator, so
    ``abort`` must free the request in every stage and be idempotent; aborting an
    unknown or finished id is a no-op. ``processor`` is called from worker threads.
    """

    model_name: str  # the id /v1/models lists and requests must name
    processor: PromptProcessor
    voices: Sequence[str]  # the checkpoint's speaker names, e.g. ("Chelsie", "Ethan", "Aiden")
    supports_audio: bool  # False when the pipeline has no talker/code2wav stages
    max_model_len: int  # the thinker's context: prompt + completion tokens
    default_sampling: SamplingDefaults  # what a request's unset sampling knobs take

    def generate(self, request: OmniRequest) -> AsyncIterator[OmniOutput]: ...

    async def abort(self, request_id: str) -> None: ...

    def health(self) -> HealthReport: ...

    def stats(self) -> EngineStats: ...

    async def shutdown(self) -> None: ...
