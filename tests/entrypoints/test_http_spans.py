"""The API's part of a trace: FastAPI's span per `/v1/` request (under the caller's), its bytes out, and its
traceparent handed to the engine's request; nothing of it without tracing."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from omnistage.entrypoints.openai.api_server import build_app
from omnistage.tracing.options import TracingOptions
from omnistage.tracing.otel import Tracing
from tests.entrypoints.conftest import TEST_LIMITS, LiveServer
from tests.entrypoints.fake_engine import FakeEngine, RecordingProcessor, fake_front_end
from tests.entrypoints.server_thread import ServerThread

CALLER_TRACE, CALLER_SPAN = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
BODY = {"model": "fake-omni", "messages": [{"role": "user", "content": "Hi"}], "modalities": ["text", "audio"],
        "audio": {"voice": "Ethan", "format": "pcm16"}, "stream": True}


@pytest.fixture(scope="module")
def traced_server(processor: RecordingProcessor) -> Iterator[tuple[LiveServer, Tracing, InMemorySpanExporter]]:
    exporter = InMemorySpanExporter()
    tracing = Tracing(TracingOptions("http://127.0.0.1:1/v1/traces", "http/protobuf"), "fake-omni", exporter=exporter)
    engine = FakeEngine(fake_front_end(processor))
    thread = ServerThread(build_app(engine, TEST_LIMITS, tracing=tracing))
    yield LiveServer(thread.start(), engine, processor.folder), tracing, exporter
    thread.stop()
    tracing.close()


def test_a_request_span_counts_the_bytes_out_and_reaches_the_engine(traced_server) -> None:  # noqa: ANN001
    server, tracing, exporter = traced_server
    exporter.clear()
    with httpx.stream("POST", f"{server.base_url}/v1/chat/completions", json=BODY, timeout=20,
                      headers={"traceparent": f"00-{CALLER_TRACE}-{CALLER_SPAN}-01"}) as reply:
        assert reply.status_code == 200
        body = reply.read()
    assert httpx.get(f"{server.base_url}/health", timeout=20).status_code == 200  # no span: not an API request
    tracing.provider.force_flush()
    spans = exporter.get_finished_spans()
    assert [s.name for s in spans] == ["POST /v1/chat/completions"]
    span = spans[0]
    assert span.kind is SpanKind.SERVER and f"{span.parent.span_id:016x}" == CALLER_SPAN
    assert f"{span.context.trace_id:032x}" == CALLER_TRACE
    assert span.attributes["http.response.status_code"] == 200
    assert span.attributes["http.response.body.size"] == len(body) > 0
    # The engine's request carries the span, so the pipeline's spans go under it.
    assert server.engine.requests[-1].traceparent == f"00-{CALLER_TRACE}-{span.context.span_id:016x}-01"


def test_an_untraced_server_hands_no_traceparent(server: LiveServer) -> None:
    with httpx.stream("POST", f"{server.base_url}/v1/chat/completions", json=BODY, timeout=20,
                      headers={"traceparent": f"00-{CALLER_TRACE}-{CALLER_SPAN}-01"}) as reply:
        assert reply.status_code == 200
        reply.read()
    assert server.engine.requests[-1].traceparent is None
