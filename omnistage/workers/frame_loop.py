"""A talker stage that runs its own frame loop (Pocket TTS's backbone, CSM's): each step, every running utterance
makes one frame, sent on as generic :class:`CodecFrames`; a family gives its runner and the payload it starts
from (a ``prompt`` and a ``sampling``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

import torch

from omnistage.engine import FinishReason
from omnistage.ipc.messages import ReplicaLoad, RequestFailed, StageInput, StageOutput
from omnistage.ipc.payloads import CodecFrames
from omnistage.workers.base import StageWorker, StepResult


class Frame(Protocol):
    request_id: str
    finished: bool
    by_length: bool  # finished at its frame budget, not by the model

    @property
    def frames(self) -> torch.Tensor | None:
        """``[n, W]`` on the host; None: a step that made no audio (a frame that only ends the utterance)."""


class FrameRunner(Protocol):
    running: Mapping[str, object]

    def add(self, request_id: str, prompt: object, sampling: object) -> None: ...

    def abort(self, request_id: str) -> None: ...

    def step(self) -> list[Frame]: ...


class FrameLoopWorker(StageWorker):
    accepts: type = object  # the family's start payload
    runner: FrameRunner

    def __init__(self, runner: FrameRunner) -> None:
        self.runner = runner
        self.last_ids: list[str] = []

    def handle(self, message: StageInput) -> list[StageOutput | RequestFailed]:
        payload = message.payload
        if not isinstance(payload, self.accepts):
            raise TypeError(f"{type(self).__name__} does not take {type(payload).__name__}")
        self.runner.add(message.request_id, payload.prompt, payload.sampling)  # type: ignore[attr-defined]
        return []

    def abort(self, request_ids: list[str]) -> None:
        for rid in request_ids:
            self.runner.abort(rid)

    def has_work(self) -> bool:
        return bool(self.runner.running)

    def step(self) -> StepResult:
        frames = self.runner.step()
        self.last_ids = [f.request_id for f in frames]
        return StepResult([_output(f) for f in frames], progressed=bool(frames))

    def load(self) -> ReplicaLoad:
        return ReplicaLoad(waiting=0, running=len(self.runner.running))

    def request_ids(self) -> list[str]:
        return list(self.runner.running)

    def scheduled_ids(self) -> list[str]:
        return self.last_ids


def _output(frame: Frame) -> StageOutput:
    frames = frame.frames
    reason = (FinishReason.LENGTH if frame.by_length else FinishReason.STOP) if frame.finished else None
    return StageOutput(frame.request_id, None if frames is None else CodecFrames(frames), frame.finished, reason)
