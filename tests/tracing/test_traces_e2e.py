"""One chat-with-audio request through `omnistage serve tiny --otlp-traces-endpoint ...` (the real command,
pipeline and stage processes), its trace collected by an OTLP/HTTP receiver in this test: one trace, the HTTP
span under the caller's, the orchestrator's under it, and one span per stage under that, each inside its
parent's time."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import httpx
import pytest

from tests.tracing.otlp_receiver import OtlpReceiver, ReceivedSpan

pytestmark = [pytest.mark.e2e, pytest.mark.slow]
READY = re.compile(r"omnistage is ready: model '[^']+' at (http://[^ ]+)/v1")
STAGES = ("thinker", "talker", "code2wav")
CALLER_TRACE, CALLER_SPAN = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
SLACK_NS = 20_000_000  # clocks read in different processes and threads: a child may seem to start this early


@pytest.fixture(scope="module")
def served() -> Iterator[tuple[str, OtlpReceiver]]:
    with OtlpReceiver() as receiver:
        # The batch exporter sends within 100 ms of a span's end instead of its default 5 s.
        env = {**os.environ, "OTEL_BSP_SCHEDULE_DELAY": "100"}
        proc = subprocess.Popen([sys.executable, "-m", "omnistage.entrypoints.cli", "serve", "tiny", "--port", "0",
                                 "--talker-min-new-tokens", "8", "--otlp-traces-endpoint", receiver.endpoint,
                                 "--otlp-traces-protocol", "http/protobuf"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
        assert proc.stderr is not None
        log: list[str] = []
        base_url = None
        deadline = time.monotonic() + 300
        for line in proc.stderr:
            log.append(line)
            if match := READY.search(line):
                base_url = match.group(1)
                break
            assert time.monotonic() < deadline, "the server did not start"
        assert base_url is not None, "".join(log[-30:])
        threading.Thread(target=lambda: log.extend(proc.stderr or ()), daemon=True).start()
        try:
            yield base_url, receiver
        finally:
            proc.terminate()
            proc.wait(60)


def _chat_with_audio(base_url: str) -> bytes:
    body = {"model": "tiny", "messages": [{"role": "user", "content": "Say hello."}],
            "modalities": ["text", "audio"], "audio": {"voice": "Ethan", "format": "pcm16"},
            "max_tokens": 6, "temperature": 0.0, "stream": True}
    headers = {"traceparent": f"00-{CALLER_TRACE}-{CALLER_SPAN}-01"}
    with httpx.stream("POST", f"{base_url}/v1/chat/completions", json=body, headers=headers, timeout=120) as reply:
        assert reply.status_code == 200, reply.read()
        data = reply.read()
    assert b'"audio"' in data and data.rstrip().endswith(b"data: [DONE]")
    return data


def _one(spans: list[ReceivedSpan], name: str) -> ReceivedSpan:
    found = [s for s in spans if s.name == name]
    assert len(found) == 1, (name, [s.name for s in spans])
    return found[0]


def _inside(child: ReceivedSpan, parent: ReceivedSpan) -> None:
    assert child.parent_id == parent.span_id, (child.name, parent.name)
    assert parent.start_ns - SLACK_NS <= child.start_ns <= child.end_ns <= parent.end_ns + SLACK_NS, \
        (child.name, child.start_ns - parent.start_ns, parent.end_ns - child.end_ns)


def test_a_chat_with_audio_is_one_trace_with_a_span_per_stage(served: tuple[str, OtlpReceiver]) -> None:
    base_url, receiver = served
    body = _chat_with_audio(base_url)
    names = {"POST /v1/chat/completions", "orchestrator", *(f"stage {s}" for s in STAGES)}
    spans = receiver.wait_for(names, timeout_s=30)
    assert {s.trace_id for s in spans} == {CALLER_TRACE}  # one trace: the caller's

    http = _one(spans, "POST /v1/chat/completions")
    assert http.parent_id == CALLER_SPAN and http.kind == 2  # SERVER
    assert http.attributes["http.response.status_code"] == 200
    assert http.attributes["http.response.body.size"] == len(body)  # bytes out

    orchestrator = _one(spans, "orchestrator")
    _inside(orchestrator, http)
    assert str(orchestrator.attributes["gen_ai.request.id"]).startswith("chatcmpl-")
    assert orchestrator.attributes["gen_ai.usage.completion_tokens"] >= 1
    assert orchestrator.attributes["gen_ai.usage.prompt_tokens"] > 0
    chunks = [e for e in orchestrator.events if e[0] == "audio.chunk"]
    assert chunks and "first_audio" in {e[0] for e in orchestrator.events}

    stage = {s: _one(spans, f"stage {s}") for s in STAGES}
    for span in stage.values():
        _inside(span, orchestrator)
        assert span.attributes["omnistage.stage.steps"] >= 1 and span.attributes["omnistage.stage.outputs"] >= 1
        assert span.attributes["gen_ai.latency.time_in_queue"] >= 0
        assert span.attributes["gen_ai.latency.time_in_model_prefill"] > 0
        assert [e[0] for e in span.events] == ["scheduled", "first_output"]
    assert stage["thinker"].start_ns <= stage["talker"].start_ns <= stage["code2wav"].start_ns
    assert stage["code2wav"].attributes["omnistage.stage.outputs"] == len(chunks)  # one output per audio chunk
    # The prompt's hidden rows for the talker, then the tokens: the first alone, the rest merged by the stream
    # interval (one output each at most).
    assert 2 <= stage["thinker"].attributes["omnistage.stage.outputs"] <= orchestrator.attributes[
        "gen_ai.usage.completion_tokens"] + 1
