"""A finished request's trace as spans (the orchestrator's sink), collected by the SDK's in-memory exporter."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from omnistage.core import FinishReason, Modality, OmniRequest, Usage
from omnistage.families.qwen3_omni.prompt import Qwen3OmniPrompt
from omnistage.ipc.messages import StageTimes
from omnistage.pipeline.request_state import ChunkSeen, RequestTrace
from omnistage.sampling_params import SamplingParams
from omnistage.tracing.options import TracingOptions
from omnistage.tracing.otel import Tracing
from omnistage.tracing.pipeline_spans import PipelineSpans

CALLER_TRACE, CALLER_SPAN = "0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331"
MS = 1_000_000


@pytest.fixture
def collected() -> Iterator[tuple[PipelineSpans, Tracing, InMemorySpanExporter]]:
    exporter = InMemorySpanExporter()
    tracing = Tracing(TracingOptions("http://127.0.0.1:1/v1/traces", "http/protobuf"), "tiny", exporter=exporter)
    yield tracing.pipeline, tracing, exporter
    tracing.close()


def _finished(tracing: Tracing, exporter: InMemorySpanExporter) -> dict[str, ReadableSpan]:
    tracing.pipeline.close()  # the sink's thread made every span queued
    tracing.provider.force_flush()
    return {span.name: span for span in exporter.get_finished_spans()}


def _trace() -> tuple[RequestTrace, int]:
    """A request that ran 100 ms: thinker 0-60 ms, talker 20-90 ms (its replica timed), code2wav 40-95 ms (not)."""
    now_mono, now_wall = time.monotonic(), time.time_ns()
    t0 = now_mono - 1.0  # arrival, a second ago
    wall0 = now_wall - 1_000_000_000
    trace = RequestTrace(arrival=t0, gated_s=0.01, first_text=t0 + 0.03, first_audio=t0 + 0.05, finished=t0 + 0.1)
    trace.entered = {"thinker": t0 + 0.001, "talker": t0 + 0.02, "code2wav": t0 + 0.04}
    trace.left = {"thinker": t0 + 0.06, "talker": t0 + 0.09, "code2wav": t0 + 0.095}
    trace.replicas = {"thinker": 0, "talker": 1, "code2wav": 0}
    trace.stage_times = {
        "thinker": StageTimes("r", wall0 + 2 * MS, wall0 + 3 * MS, wall0 + 25 * MS, wall0 + 60 * MS, 5, 6),
        "talker": StageTimes("r", wall0 + 21 * MS, wall0 + 22 * MS, wall0 + 35 * MS, wall0 + 89 * MS, 9, 9),
    }
    trace.chunks = [ChunkSeen("code2wav", t0 + 0.05, 0, 0.16, 0.002), ChunkSeen("code2wav", t0 + 0.09, 1, 0.4, 0.003)]
    trace.usage, trace.reason = Usage(12, 5, 4), FinishReason.LENGTH
    return trace, wall0


def _request(traceparent: str | None) -> OmniRequest:
    return OmniRequest("chatcmpl-1", Qwen3OmniPrompt([1, 2, 3]), frozenset({Modality.TEXT, Modality.AUDIO}),
                       SamplingParams(max_tokens=5, temperature=0.7), traceparent=traceparent)


def test_the_orchestrator_span_goes_under_the_callers_and_each_stage_under_it(collected) -> None:  # noqa: ANN001
    sink, tracing, exporter = collected
    trace, wall0 = _trace()
    sink(_request(f"00-{CALLER_TRACE}-{CALLER_SPAN}-01"), trace)
    spans = _finished(tracing, exporter)
    assert set(spans) == {"orchestrator", "stage thinker", "stage talker", "stage code2wav"}
    orchestrator = spans["orchestrator"]
    assert f"{orchestrator.context.trace_id:032x}" == CALLER_TRACE
    assert f"{orchestrator.parent.span_id:016x}" == CALLER_SPAN
    attributes = orchestrator.attributes
    assert attributes["gen_ai.request.id"] == "chatcmpl-1" and attributes["gen_ai.response.model"] == "tiny"
    assert (attributes["gen_ai.usage.prompt_tokens"], attributes["gen_ai.usage.completion_tokens"]) == (12, 5)
    assert attributes["gen_ai.request.max_tokens"] == 5 and attributes["gen_ai.response.finish_reasons"] == ("length",)
    assert attributes["gen_ai.latency.e2e"] == pytest.approx(0.1)
    assert attributes["gen_ai.latency.time_to_first_token"] == pytest.approx(0.03)
    # The span starts when the request reached the orchestrator, its audio gate's wait included (clock
    # conversion: within a millisecond).
    assert abs(orchestrator.start_time - (wall0 - 10 * MS)) < MS
    assert abs(orchestrator.end_time - (wall0 + 100 * MS)) < MS
    assert [e.name for e in orchestrator.events] == ["first_text", "first_audio", "audio.chunk", "audio.chunk"]
    assert orchestrator.events[3].attributes["omnistage.chunk.index"] == 1

    for name in ("stage thinker", "stage talker", "stage code2wav"):
        assert spans[name].parent.span_id == orchestrator.context.span_id
        assert spans[name].context.trace_id == orchestrator.context.trace_id
    thinker = spans["stage thinker"]
    assert (thinker.start_time, thinker.end_time) == (wall0 + 2 * MS, wall0 + 60 * MS)  # the replica's own times
    assert thinker.attributes["gen_ai.latency.time_in_queue"] == pytest.approx(0.001)
    assert thinker.attributes["gen_ai.latency.time_in_model_prefill"] == pytest.approx(0.022)
    assert thinker.attributes["gen_ai.latency.time_in_model_decode"] == pytest.approx(0.035)
    assert (thinker.attributes["omnistage.stage.steps"], thinker.attributes["omnistage.stage.outputs"]) == (5, 6)
    assert [e.name for e in thinker.events] == ["scheduled", "first_output"]
    assert spans["stage talker"].attributes["omnistage.replica"] == 1
    code2wav = spans["stage code2wav"]  # no times from its replica: the orchestrator's view
    assert abs(code2wav.start_time - (wall0 + 40 * MS)) < MS and abs(code2wav.end_time - (wall0 + 95 * MS)) < MS
    assert "gen_ai.latency.time_in_queue" not in code2wav.attributes and not code2wav.events


def test_a_request_without_a_callers_span_starts_its_own_trace(collected) -> None:  # noqa: ANN001
    sink, tracing, exporter = collected
    trace, _ = _trace()
    sink(_request(None), trace)
    spans = _finished(tracing, exporter)
    assert spans["orchestrator"].parent is None
    assert spans["stage thinker"].parent.span_id == spans["orchestrator"].context.span_id
