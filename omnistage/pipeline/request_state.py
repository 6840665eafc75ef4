"""The orchestrator's view of one request in flight: where it runs, what it produced, when."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from omnistage.core import FinishReason, OmniOutput, OmniRequest
from omnistage.pipeline.detokenizer import IncrementalDetokenizer

if TYPE_CHECKING:
    from omnistage.families.base import RequestEdge
    from omnistage.pipeline.codec_edge import CodecEdge

# Receives each delta of a request; called from the orchestrator's thread, so it must not block.
OutputSink = Callable[[OmniOutput], None]


@dataclass
class RequestTrace:
    """``time.monotonic()`` of each milestone (None until reached), when each stage took the request and let it
    go, and the replica each stage used."""

    replicas: dict[str, int] = field(default_factory=dict)
    entered: dict[str, float] = field(default_factory=dict)
    left: dict[str, float] = field(default_factory=dict)
    arrival: float = field(default_factory=time.monotonic)
    first_text: float | None = None
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
class RequestState:
    """``stages``: the stages this request runs through; ``open``/``closed``: those holding it now and those
    done with it. It is complete once every stage it entered is done (a stage opens only while the one before
    it runs, so nothing can open after that)."""

    request: OmniRequest
    sink: OutputSink
    detok: IncrementalDetokenizer
    stages: frozenset[str] = frozenset()
    trace: RequestTrace = field(default_factory=RequestTrace)
    num_prompt_tokens: int = 0
    num_cached_tokens: int = 0
    num_output_tokens: int = 0
    reason: FinishReason | None = None
    open: set[str] = field(default_factory=set)
    closed: set[str] = field(default_factory=set)
    edges: dict[tuple[str, str], RequestEdge] = field(default_factory=dict)  # (source, target) → its crossing
    audio: CodecEdge | None = None  # its codec edge's plan; None for text-only requests

    @property
    def request_id(self) -> str:
        return self.request.request_id

    @property
    def complete(self) -> bool:
        return not self.open
