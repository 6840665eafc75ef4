"""The orchestrator's view of one request in flight: where it runs, what it produced, when."""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from omnistage.core import FinishReason, OmniOutput, OmniRequest, Usage
from omnistage.ipc.messages import StageTimes
from omnistage.pipeline.detokenizer import IncrementalDetokenizer

if TYPE_CHECKING:
    from omnistage.families.base import RequestEdge
    from omnistage.pipeline.codec_edge import CodecEdge

logger = logging.getLogger(__name__)
KEEP_TRACES = 256

# Receives each delta of a request; called from the orchestrator's thread, so it must not block.
OutputSink = Callable[[OmniOutput], None]


@dataclass(frozen=True)
class ChunkSeen:
    """An audio chunk of ``stage`` as it reached the orchestrator (recorded only when tracing): its index, its
    seconds of audio and its share of the vocoder step that made it."""

    stage: str
    at: float  # time.monotonic()
    index: int
    seconds: float
    busy_s: float


@dataclass
class RequestTrace:
    """``time.monotonic()`` of each milestone (None until reached), when each stage took the request and let it
    go, and the replica each stage used. When tracing, also each timed replica's own view of its stage
    (``stage_times``), the audio chunks as they came, and how the request ended."""

    replicas: dict[str, int] = field(default_factory=dict)
    entered: dict[str, float] = field(default_factory=dict)
    left: dict[str, float] = field(default_factory=dict)
    arrival: float = field(default_factory=time.monotonic)
    gated_s: float = 0.0  # how long the audio gate held it before ``arrival``
    first_text: float | None = None
    first_frames: float | None = None
    first_audio: float | None = None
    finished: float | None = None
    stage_times: dict[str, StageTimes] = field(default_factory=dict)
    chunks: list[ChunkSeen] = field(default_factory=list)
    usage: Usage | None = None
    reason: FinishReason | None = None

    def mark(self, name: str) -> None:
        if getattr(self, name) is None:
            setattr(self, name, time.monotonic())

    @property
    def time_to_first_audio(self) -> float | None:
        return None if self.first_audio is None else self.first_audio - self.arrival

    @property
    def total_time(self) -> float | None:
        return None if self.finished is None else self.finished - self.arrival


# Receives each finished request's trace when the server traces; called from the orchestrator's thread, so it
# must not block (``omnistage/tracing/``'s exporter only queues spans).
TraceSink = Callable[[OmniRequest, RequestTrace], None]


class TraceBook:
    """The traces of the last ``KEEP_TRACES`` finished requests (``Orchestrator.trace``); when the server traces,
    each also goes to its ``sink`` as its request finishes."""

    def __init__(self, sink: TraceSink | None = None) -> None:
        self.sink = sink
        self.recent: OrderedDict[str, RequestTrace] = OrderedDict()  # newest last

    def get(self, request_id: str) -> RequestTrace | None:
        return self.recent.get(request_id)

    def record(self, request: OmniRequest, trace: RequestTrace) -> None:
        trace.mark("finished")
        self.recent[request.request_id] = trace
        while len(self.recent) > KEEP_TRACES:
            self.recent.popitem(last=False)
        if self.sink is not None:
            try:
                self.sink(request, trace)
            except Exception:  # noqa: BLE001 - a tracing fault must never fail or stall a request
                logger.exception("tracing %s failed", request.request_id)


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
    input_open: bool = False  # more input is fed to it (``OmniRequest.open_input``) until a delta that is done

    @property
    def request_id(self) -> str:
        return self.request.request_id

    @property
    def complete(self) -> bool:
        return not self.open
