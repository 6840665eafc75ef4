"""The orchestrator's view of one request in flight: where it runs, what it produced, when."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from omnistage.core import FinishReason, OmniOutput, OmniRequest
from omnistage.pipeline.detokenizer import IncrementalDetokenizer
from omnistage.pipeline.playback import Playback
from omnistage.pipeline.spoken import SpokenTokens

SAMPLE_RATE = 24000

if TYPE_CHECKING:
    from omnistage.pipeline.chunk_planner import PlaybackPlanner
    from omnistage.pipeline.qwen3_omni_stages import FrameChunker

# Receives each delta of a request; called from the orchestrator's thread, so it must not block.
OutputSink = Callable[[OmniOutput], None]

_REASONS = {"stop": FinishReason.STOP, "length": FinishReason.LENGTH, "abort": FinishReason.ABORT}


def finish_reason(name: str | None) -> FinishReason:
    return _REASONS.get(name or "stop", FinishReason.STOP)


@dataclass
class RequestTrace:
    """``time.monotonic()`` of each milestone (None until reached) and the replica each stage used."""

    replicas: dict[str, int] = field(default_factory=dict)
    arrival: float = field(default_factory=time.monotonic)
    first_text: float | None = None
    thinker_done: float | None = None
    talker_start: float | None = None
    first_frames: float | None = None
    first_audio: float | None = None
    finished: float | None = None

    def mark(self, name: str) -> None:
        if getattr(self, name) is None:
            setattr(self, name, time.monotonic())

    @property
    def time_to_first_audio(self) -> float | None:
        return None if self.first_audio is None else self.first_audio - self.arrival

    @property
    def total_time(self) -> float | None:
        return None if self.finished is None else self.finished - self.arrival


@dataclass
class AudioProgress:
    """The talker → code2wav leg of one request: its chunker, its caller's player, and the planner that
    measures its paces (and, when the caller plays the audio as it arrives, sizes its chunks)."""

    chunker: FrameChunker
    initial_chunk_frames: int
    playback: Playback
    planner: PlaybackPlanner
    talker_done: bool = False
    chunks_sent: int = 0
    chunks_received: int = 0

    @property
    def done(self) -> bool:
        return self.talker_done and self.chunks_received == self.chunks_sent


@dataclass
class RequestState:
    request: OmniRequest
    sink: OutputSink
    detok: IncrementalDetokenizer
    trace: RequestTrace = field(default_factory=RequestTrace)
    num_prompt_tokens: int = 0
    num_cached_tokens: int = 0
    num_output_tokens: int = 0
    thinker_done: bool = False
    reason: FinishReason | None = None
    talker_started: bool = False
    audio: AudioProgress | None = None  # None for text-only requests
    spoken: SpokenTokens = field(init=False)  # the thinker tokens its talker is fed
    talker_hidden: torch.Tensor | None = None  # the thinker's first message's states, until the talker starts

    def __post_init__(self) -> None:
        self.spoken = SpokenTokens(self.request.unspoken)

    @property
    def request_id(self) -> str:
        return self.request.request_id

    @property
    def complete(self) -> bool:
        return self.thinker_done and (self.audio is None or self.audio.done)
