"""A stage worker over a frame loop: a runner that holds its running utterances by request id and steps each
by one frame a step (Pocket TTS's backbone, Higgs Audio v2's generator). What the replica asks of such a stage
(aborts, whether it has work, its load, who it holds, who the last step ran) is the runner's ``running`` table."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from omnistage.ipc.messages import ReplicaLoad
from omnistage.workers.base import StageWorker


class FrameLoop(Protocol):
    @property
    def running(self) -> Mapping[str, object]: ...

    def abort(self, request_id: str) -> None: ...


class FrameLoopWorker(StageWorker):
    """A subclass sets ``runner`` and records each step's requests in ``last_ids``; it handles inputs and steps."""

    runner: FrameLoop
    last_ids: list[str]

    def abort(self, request_ids: list[str]) -> None:
        for rid in request_ids:
            self.runner.abort(rid)

    def has_work(self) -> bool:
        return bool(self.runner.running)

    def load(self) -> ReplicaLoad:
        return ReplicaLoad(waiting=0, running=len(self.runner.running))

    def request_ids(self) -> list[str]:
        return list(self.runner.running)

    def scheduled_ids(self) -> list[str]:
        return self.last_ids
