"""Which replica of a stage serves a request: least-loaded on arrival, then always the same one.

Load is the number of requests the orchestrator has placed on a replica and
not yet released: known at once (replica-reported stats lag by a pass) and
it counts requests that are still waiting for input from an earlier stage.
Ties go to the lowest index, so a lone request always lands on replica 0.
Unhealthy replicas get no new requests.
"""

from __future__ import annotations


class NoHealthyReplica(RuntimeError):
    pass


class StageRouter:
    def __init__(self, stage: str, num_replicas: int) -> None:
        self.stage = stage
        self.active = [0] * num_replicas
        self.healthy = [True] * num_replicas
        self._placed: dict[str, int] = {}

    def place(self, request_id: str) -> int:
        """The request's replica, choosing the least loaded healthy one the first time."""
        if request_id in self._placed:
            return self._placed[request_id]
        candidates = [i for i, ok in enumerate(self.healthy) if ok]
        if not candidates:
            raise NoHealthyReplica(f"stage {self.stage!r} has no healthy replica")
        best = min(candidates, key=lambda i: (self.active[i], i))
        self.active[best] += 1
        self._placed[request_id] = best
        return best

    def replica_of(self, request_id: str) -> int | None:
        return self._placed.get(request_id)

    def release(self, request_id: str) -> None:
        index = self._placed.pop(request_id, None)
        if index is not None:
            self.active[index] -= 1

    def requests_on(self, index: int) -> list[str]:
        return [rid for rid, i in self._placed.items() if i == index]
