"""When one replica held each request: what its stage's span is made of (tracing on only).

A replica launched ``timed`` keeps a :class:`StageTimes` per request it holds and sends it, just before the
request's last output there (so the orchestrator has it when that output completes the request), or when the
request is aborted. The spans themselves are made in the server's process (``omnistage/tracing/``): a stage
process then needs no OpenTelemetry SDK, no exporter and no trace context, and a replica killed mid-request
loses nothing that was already sent. A replica not timed has no clock at all (``ReplicaLoop.clock`` is None).
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Iterable

from omnistage.ipc.messages import RequestFailed, StageOutput, StageTimes

# Requests timed at once, at most: far more than a replica runs. A request can leave without a last output or an
# abort here (a codec replica drops a chunk that reaches it after its request's abort): the oldest goes first.
MAX_HELD = 4096


class StageClock:
    def __init__(self) -> None:
        self.held: OrderedDict[str, StageTimes] = OrderedDict()

    def received(self, request_id: str) -> None:
        """An input of the request reached the engine loop (only its first counts)."""
        if request_id and request_id not in self.held:
            self.held[request_id] = StageTimes(request_id, time.time_ns())
            if len(self.held) > MAX_HELD:
                self.held.popitem(last=False)

    def stepped(self, request_ids: Iterable[str], began_ns: int) -> None:
        """An engine step that began at ``began_ns`` computed for these requests."""
        for rid in request_ids:
            times = self.held.get(rid)
            if times is not None:
                times.steps += 1
                times.scheduled_ns = times.scheduled_ns or began_ns

    def outputs(self, outputs: list[StageOutput | RequestFailed]) -> list[StageOutput | RequestFailed | StageTimes]:
        """The outputs, each request's times before its last one; a failed request's times are dropped (its
        span is the orchestrator's view alone)."""
        if not outputs:
            return outputs  # type: ignore[return-value]
        now = time.time_ns()
        timed: list[StageOutput | RequestFailed | StageTimes] = []
        for output in outputs:
            if isinstance(output, RequestFailed):
                self.held.pop(output.request_id, None)
            elif isinstance(output, StageOutput) and (times := self.held.get(output.request_id)) is not None:
                times.outputs += 1
                times.first_output_ns = times.first_output_ns or now
                if output.finished:
                    times.finished_ns = now
                    timed.append(self.held.pop(output.request_id))
            timed.append(output)
        return timed

    def noted(self, request_ids: Iterable[str]) -> None:
        """A talker's plain frame notices (``FrameNotes``): outputs too, never a request's last."""
        now = time.time_ns()
        for rid in request_ids:
            times = self.held.get(rid)
            if times is not None:
                times.outputs += 1
                times.first_output_ns = times.first_output_ns or now

    def aborted(self, request_ids: Iterable[str]) -> list[StageTimes]:
        """The times of the requests an abort let go (a stop string ends a stage this way)."""
        now = time.time_ns()
        gone = [self.held.pop(rid) for rid in request_ids if rid in self.held]
        for times in gone:
            times.finished_ns, times.aborted = now, True
        return gone
