"""/v1/models, /health, /metrics and /openapi.json."""

from __future__ import annotations

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.entrypoints.conftest import LiveServer


def test_models(server: LiveServer) -> None:
    client = server.client()
    models = client.models.list()
    assert [m.id for m in models.data] == ["fake-omni"]
    assert client.models.retrieve("fake-omni").owned_by == "omnistage"
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("gpt-4o")


def test_health_reports_each_stage_replica(server: LiveServer) -> None:
    body = httpx.get(f"{server.base_url}/health").json()
    assert body["status"] == "ok"
    stages = {s["stage"]: s for s in body["stages"]}
    assert set(stages) == {"thinker", "talker", "code2wav"}
    assert [r["replica"] for r in stages["talker"]["replicas"]] == [0, 1]


def test_health_is_503_when_a_stage_has_no_healthy_replica(server: LiveServer) -> None:
    server.engine.healthy = False
    resp = httpx.get(f"{server.base_url}/health")
    assert resp.status_code == 503
    body = resp.json()
    stages = {s["stage"]: s for s in body["stages"]}
    assert body["status"] == "unhealthy" and not stages["thinker"]["healthy"]
    # The talker still has one healthy replica, so it still serves.
    assert stages["talker"]["healthy"]
    assert stages["talker"]["replicas"][1] == {"replica": 1, "healthy": False, "detail": "process died",
                                               "kv_blocks_total": 0, "kv_cache_bytes": 0}
    assert stages["thinker"]["replicas"][0]["kv_blocks_total"] == 100
    assert stages["thinker"]["replicas"][0]["kv_cache_bytes"] == 101 * 4096


def _samples(server: LiveServer) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = httpx.get(f"{server.base_url}/metrics").text
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def test_metrics(server: LiveServer) -> None:
    client = server.client()
    client.chat.completions.create(model="fake-omni", messages=[{"role": "user", "content": "hi"}],
                                   modalities=["text", "audio"], audio={"voice": "ethan", "format": "wav"})
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="fake-omni", messages=[{"role": "user", "content": "hi"}], n=99)
    samples = _samples(server)
    chat = ("endpoint", "/v1/chat/completions")
    assert samples[("omnistage_kv_blocks_used", (("replica", "0"), ("stage", "thinker")))] == 12
    assert samples[("omnistage_kv_blocks_total", (("replica", "1"), ("stage", "talker")))] == 50
    assert samples[("omnistage_kv_cache_bytes", (("replica", "0"), ("stage", "thinker")))] == 101 * 4096
    assert samples[("omnistage_queue_depth", (("replica", "0"), ("stage", "code2wav")))] == 1
    assert samples[("omnistage_requests_total", (chat, ("outcome", "ok")))] >= 1
    assert samples[("omnistage_requests_total", (chat, ("outcome", "client_error")))] >= 1
    assert samples[("omnistage_time_to_first_token_seconds_count", (chat,))] >= 1
    assert samples[("omnistage_time_to_first_audio_seconds_count", (chat,))] >= 1
    assert samples[("omnistage_audio_real_time_factor_count", (chat,))] >= 1
    assert samples[("omnistage_requests_in_flight", (chat,))] == 0


def _resolve(schema: dict[str, object], node: dict[str, object]) -> dict[str, object]:
    ref = node.get("$ref")
    return schema["components"]["schemas"][ref.rsplit("/", 1)[-1]] if isinstance(ref, str) else node


def test_openapi_matches_what_is_served(server: LiveServer) -> None:
    schema = httpx.get(f"{server.base_url}/openapi.json").json()
    routes = {(path, method) for path, ops in schema["paths"].items() for method in ops}
    assert routes == {("/v1/chat/completions", "post"), ("/v1/audio/speech", "post"), ("/v1/models", "get"),
                      ("/v1/models/{model}", "get"), ("/health", "get"), ("/ready", "get"), ("/metrics", "get"),
                      ("/v1/audio/voices", "post"), ("/v1/audio/voices", "get"), ("/v1/audio/voices/{name}", "delete"),
                      ("/v1/audio/transcriptions", "post"), ("/v1/audio/translations", "post"),
                      ("/v1/realtime/client_secrets", "post"), ("/v1/responses", "post"),
                      ("/v1/responses/{response_id}", "get"), ("/v1/responses/{response_id}", "delete"),
                      ("/v1/realtime/calls", "post"), ("/v1/realtime/calls/{call_id}", "delete"),
                      ("/v1/realtime/calls/{call_id}/hangup", "post"), ("/v1/live/sessions", "post"),
                      ("/v1/live/sessions/{session_id}/hangup", "post")}
    chat = schema["paths"]["/v1/chat/completions"]["post"]
    assert "422" not in chat["responses"]
    assert chat["responses"]["400"]["content"]["application/json"]["schema"]["$ref"].endswith("/ErrorResponse")
    assert "text/event-stream" in chat["responses"]["200"]["content"]
    request_schema = _resolve(schema, chat["requestBody"]["content"]["application/json"]["schema"])
    assert {"model", "messages", "modalities", "audio", "stream", "stream_options"} <= set(request_schema["properties"])
    # A served reply has exactly the documented top-level fields.
    reply = httpx.post(f"{server.base_url}/v1/chat/completions",
                       json={"model": "fake-omni", "messages": [{"role": "user", "content": "hi"}]}).json()
    reply_schema = _resolve(schema, chat["responses"]["200"]["content"]["application/json"]["schema"])
    assert set(reply) == set(reply_schema["properties"])
    assert {"ChatCompletionChunk", "SpeechAudioDelta", "SpeechAudioDone"} <= set(schema["components"]["schemas"])
    assert "HTTPValidationError" not in schema["components"]["schemas"]
    speech = schema["paths"]["/v1/audio/speech"]["post"]["responses"]["200"]["content"]
    assert {"audio/mpeg", "audio/wav", "text/event-stream"} <= set(speech)


def _underruns(server: LiveServer) -> tuple[float, float, float]:
    samples = _samples(server)
    chat = (("endpoint", "/v1/chat/completions"),)
    return (samples.get(("omnistage_audio_underruns_total", chat), 0.0),
            samples.get(("omnistage_audio_stall_seconds_count", chat), 0.0),
            samples.get(("omnistage_audio_stall_seconds_sum", chat), 0.0))


def _stream_speech(server: LiveServer) -> None:
    stream = server.client().chat.completions.create(
        model="fake-omni", messages=[{"role": "user", "content": "hi"}], modalities=["text", "audio"],
        audio={"voice": "ethan", "format": "pcm16"}, stream=True)
    for _ in stream:
        pass


def test_underruns_of_streamed_speech_are_counted_with_their_stalls(server: LiveServer) -> None:
    engine = server.engine
    before = _underruns(server)
    engine.delay_s, engine.chunk_seconds = 0.0, 0.1  # all audio at once: a player never runs dry
    _stream_speech(server)
    assert _underruns(server) == before
    engine.delay_s, engine.chunk_seconds = 0.15, 0.03  # 30 ms of audio every 150 ms: dry after each chunk
    _stream_speech(server)
    count, stalls, stall_s = (a - b for a, b in zip(_underruns(server), before))
    assert count == stalls >= len(engine.words) - 2  # every chunk after the first arrived late
    assert 0.08 * stalls <= stall_s <= 0.5 * stalls  # ~120 ms each

