"""What a running pipeline reports about itself: replica health and load (frozen, so both sides agree)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from omnistage.core import Modality

HealthStatus = Literal["ok", "degraded", "unhealthy"]


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
    # The stages each output needs (text: the thinker; audio: thinker, talker, code2wav), from the pipeline's
    # graph. Empty when unknown: every request then needs every stage.
    needs: tuple[tuple[Modality, frozenset[str]], ...] = ()

    @property
    def healthy(self) -> bool:
        return bool(self.stages) and all(s.healthy for s in self.stages)

    def down(self, modalities: frozenset[Modality] | None = None) -> tuple[str, ...]:
        """The stages with no healthy replica that a request for ``modalities`` runs through (``None``, or
        needs unknown: every stage)."""
        wanted = dict(self.needs)
        if modalities is None or not wanted or any(m not in wanted for m in modalities):
            needed = {s.stage for s in self.stages}
        else:
            needed = set().union(*(wanted[m] for m in modalities))
        return tuple(s.stage for s in self.stages if s.stage in needed and not s.healthy)

    @property
    def status(self) -> HealthStatus:
        """``ok``: every stage serves. ``degraded``: some stage has no healthy replica (e.g. its node was lost and
        none other fits its placement), yet some output still has all it needs (text without the talker).
        ``unhealthy``: nothing can be served."""
        if self.healthy:
            return "ok"
        return "degraded" if any(not self.down(frozenset({m})) for m, _ in self.needs) else "unhealthy"


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

    def crossings(self) -> dict[tuple[str, str], int]:
        """Bytes through the orchestrator's sockets so far by (stage, "to" or "from"): under Ray, what crosses the
        head node for each stage on another."""
        out: dict[tuple[str, str], int] = {}
        for r in self.replicas:
            out[(r.stage, "to")] = out.get((r.stage, "to"), 0) + r.bytes_sent
            out[(r.stage, "from")] = out.get((r.stage, "from"), 0) + r.bytes_received
        return out
