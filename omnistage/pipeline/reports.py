"""What a running pipeline reports about itself: replica health and load (frozen, so both sides agree)."""

from __future__ import annotations

from dataclasses import dataclass


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
    graphs_captured: int = 0  # CUDA graph sets captured at start-up
    graph_capture_failures: int = 0  # sets that failed to capture: their steps run eagerly
    # Bytes the orchestrator's sockets sent this replica and got from it (message frames; a tensor that went
    # through shared memory counts as its key): what crosses the server's host, for a replica on another node.
    bytes_sent: int = 0
    bytes_received: int = 0


@dataclass(frozen=True)
class EngineStats:
    replicas: tuple[ReplicaStats, ...]
    shm_segments: int = 0  # shared-memory tensors written by one stage and not yet taken by the next
