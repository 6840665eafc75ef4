"""What a stage replica's loop drives: a ``StageWorker`` turning wire inputs into wire outputs.

A worker owns one stage engine (thinker, talker, code2wav, or a test fake).
The replica loop (:mod:`omnistage.pipeline.replica`) feeds it every input
that arrived, steps it while it has work, and ships what it returns; the
worker never touches sockets, threads or processes.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field

from omnistage.ipc.messages import ReplicaInput, ReplicaLoad, StageOutput


@dataclass
class StepResult:
    outputs: list[StageOutput] = field(default_factory=list)
    # False when the step scheduled nothing (every request waits on input): the loop then blocks on input.
    progressed: bool = True


class StageWorker(ABC):
    @abstractmethod
    def handle(self, message: ReplicaInput) -> list[StageOutput]:
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


# Builds a replica's worker inside the replica (after the process started); must pickle for ``spawn``.
WorkerFactory = Callable[[], StageWorker]
