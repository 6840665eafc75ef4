"""A finished request's spans below its HTTP span: the orchestrator's, and one per stage it entered.

This is the orchestrator's ``TraceSink``: once a request is done it makes every span at once with the times
recorded meanwhile (the orchestrator's ``time.monotonic()`` milestones, each timed replica's ``StageTimes`` in
``time.time_ns()``), so nothing OpenTelemetry touches the request while it runs and no stage process needs the
SDK. The orchestrator's thread only queues the finished trace (~1 us): the spans (~0.2 ms a request) are made
on a thread of their own, since the orchestrator's thread paces every stream.

A stage's span runs from its replica's first input to its last output (its queue wait, prefill and decode as
attributes and events); a stage whose replica sent no times (a failed request, a replica not timed) gets the
orchestrator's view: from its first input sent to its end seen.
Attribute names follow vLLM's (``gen_ai.*``, OpenTelemetry's GenAI conventions and vLLM's additions);
``omnistage.*`` ones say what those do not.
"""

from __future__ import annotations

import logging
import queue
import threading
import time

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import Tracer
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from omnistage.core import OmniRequest
from omnistage.ipc.messages import StageTimes
from omnistage.pipeline.request_state import RequestTrace

logger = logging.getLogger(__name__)
NS = 1_000_000_000
_PROPAGATOR = TraceContextTextMapPropagator()  # W3C trace context: stateless


def context_of(traceparent: str | None) -> Context | None:
    """The context a W3C ``traceparent`` names (None, or one that does not parse: a new trace's root)."""
    return _PROPAGATOR.extract({"traceparent": traceparent}) if traceparent else None


class PipelineSpans:
    """The sink: ``model`` is the served model's name (``gen_ai.response.model``). ``close`` makes the spans of
    every trace queued by then."""

    def __init__(self, tracer: Tracer, model: str) -> None:
        self.tracer = tracer
        self.model = model
        self._queue: queue.SimpleQueue[tuple[OmniRequest, RequestTrace] | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="omnistage-trace-spans", daemon=True)
        self._thread.start()

    def __call__(self, request: OmniRequest, trace_: RequestTrace) -> None:
        self._queue.put((request, trace_))

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join(timeout=10)

    def _run(self) -> None:
        while (item := self._queue.get()) is not None:
            try:
                self.spans(*item)
            except Exception:  # noqa: BLE001 - one trace's fault must not stop the others'
                logger.exception("making the spans of %s failed", item[0].request_id)

    def spans(self, request: OmniRequest, trace_: RequestTrace) -> None:
        """Every span of one finished request (on the caller's thread)."""
        offset = time.time_ns() - time.monotonic_ns()  # this process's monotonic times → epoch nanoseconds

        def wall(t: float) -> int:
            return int(t * NS) + offset

        finished = trace_.finished if trace_.finished is not None else trace_.arrival
        span = self.tracer.start_span("orchestrator", context=context_of(request.traceparent),
                                      start_time=wall(trace_.arrival - trace_.gated_s),
                                      attributes=self._request_attributes(request, trace_))
        for name in ("first_text", "first_frames", "first_audio"):
            at = getattr(trace_, name)
            if at is not None:
                span.add_event(name, timestamp=wall(at))
        for chunk in trace_.chunks:
            span.add_event("audio.chunk", {"omnistage.stage": chunk.stage, "omnistage.chunk.index": chunk.index,
                                           "omnistage.chunk.audio_s": chunk.seconds,
                                           "omnistage.chunk.busy_s": chunk.busy_s}, timestamp=wall(chunk.at))
        context = trace.set_span_in_context(span)
        for stage in sorted(trace_.entered, key=trace_.entered.__getitem__):
            times = trace_.stage_times.get(stage)
            if times is not None and times.finished_ns:
                start, end = times.received_ns, times.finished_ns
            else:
                start, end = wall(trace_.entered[stage]), wall(trace_.left.get(stage, finished))
            child = self.tracer.start_span(f"stage {stage}", context=context, start_time=start,
                                           attributes={"omnistage.stage": stage,
                                                       "omnistage.replica": trace_.replicas.get(stage, -1)})
            if times is not None:
                _time_stage(child, times)
            child.end(end_time=end)
        span.end(end_time=wall(finished))

    def _request_attributes(self, request: OmniRequest, trace_: RequestTrace) -> dict[str, object]:
        sampling = request.sampling
        found: dict[str, object] = {
            "gen_ai.request.id": request.request_id, "gen_ai.response.model": self.model,
            "gen_ai.request.temperature": sampling.temperature, "gen_ai.request.top_p": sampling.top_p,
            "omnistage.request.modalities": sorted(m.value for m in request.modalities),
            "omnistage.audio_gate.wait_s": trace_.gated_s,
        }
        if sampling.max_tokens is not None:
            found["gen_ai.request.max_tokens"] = sampling.max_tokens
        if trace_.usage is not None:
            found["gen_ai.usage.prompt_tokens"] = trace_.usage.prompt_tokens
            found["gen_ai.usage.completion_tokens"] = trace_.usage.completion_tokens
            found["omnistage.usage.cached_tokens"] = trace_.usage.cached_tokens
        if trace_.reason is not None:
            found["gen_ai.response.finish_reasons"] = [trace_.reason.value]
        if trace_.total_time is not None:
            found["gen_ai.latency.e2e"] = trace_.total_time
        if trace_.first_text is not None:
            found["gen_ai.latency.time_to_first_token"] = trace_.first_text - trace_.arrival
        if trace_.time_to_first_audio is not None:
            found["omnistage.latency.time_to_first_audio"] = trace_.time_to_first_audio
        return found


def _time_stage(span: trace.Span, times: StageTimes) -> None:
    """A stage's own times: its queue wait (first input → first step computing for it), its prefill (→ first
    output: an AR stage's first token, a codec stage's first chunk) and decode (→ last output)."""
    span.set_attributes({"omnistage.stage.steps": times.steps, "omnistage.stage.outputs": times.outputs,
                         "omnistage.stage.aborted": times.aborted})
    if times.scheduled_ns:
        span.set_attribute("gen_ai.latency.time_in_queue", (times.scheduled_ns - times.received_ns) / NS)
        span.add_event("scheduled", timestamp=times.scheduled_ns)
    if times.first_output_ns:
        if times.scheduled_ns:
            span.set_attribute("gen_ai.latency.time_in_model_prefill",
                               (times.first_output_ns - times.scheduled_ns) / NS)
        span.set_attribute("gen_ai.latency.time_in_model_decode", (times.finished_ns - times.first_output_ns) / NS)
        span.add_event("first_output", timestamp=times.first_output_ns)
