"""Hostile input beyond test_errors.py's cases: each is a 4xx JSON error and the server stays up.

Also a schemathesis run over ``/openapi.json`` (every operation, generated bodies, against the fake engine
in-process): no 5xx, every error in OpenAI's shape.
"""

from __future__ import annotations

import json
import struct
import zlib

import httpx
import pytest

from tests.entrypoints.conftest import LiveServer
from tests.entrypoints.media_samples import b64, data_url

Body = dict[str, object]


def _wav(rate: int, frames: int, channels: int = 1) -> bytes:
    """A PCM16 WAV whose header says ``rate`` (whatever that is) and holds ``frames`` silent frames."""
    data = b"\0\0" * frames * channels
    fmt = struct.pack("<HHIIHH", 1, channels, rate, rate * 2 * channels, 2 * channels, 16)
    return (b"RIFF" + struct.pack("<I", 36 + len(data)) + b"WAVE" + b"fmt " + struct.pack("<I", 16) + fmt
            + b"data" + struct.pack("<I", len(data)) + data)


def _png_header(width: int, height: int) -> bytes:
    """A PNG that claims ``width`` x ``height`` pixels and has no pixel data at all."""
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    chunk = b"IHDR" + ihdr
    return b"\x89PNG\r\n\x1a\n" + struct.pack(">I", len(ihdr)) + chunk + struct.pack(">I", zlib.crc32(chunk))


def _audio(data: bytes, fmt: str = "wav") -> Body:
    return {"type": "input_audio", "input_audio": {"data": b64(data), "format": fmt}}


def _user(*parts: object) -> list[Body]:
    return [{"role": "user", "content": [{"type": "text", "text": "hi"}, *parts]}]


# (case id, body fields, expected status)
HOSTILE: list[tuple[str, Body, int]] = [
    ("zero-length audio", {"messages": _user(_audio(b""))}, 400),
    ("wav with no frames", {"messages": _user(_audio(_wav(16000, 0)))}, 400),
    ("wav at 0 Hz", {"messages": _user(_audio(_wav(0, 100)))}, 400),
    ("wav at 1 Hz (hours of audio)", {"messages": _user(_audio(_wav(1, 20_000)))}, 400),
    ("wav at 10 MHz", {"messages": _user(_audio(_wav(10_000_000, 1000)))}, 400),
    ("base64 of random bytes", {"messages": _user({"type": "input_audio",
                                                   "input_audio": {"data": "////" * 1000, "format": "wav"}})}, 400),
    ("base64 with bad padding", {"messages": _user({"type": "input_audio",
                                                    "input_audio": {"data": "QUJD=A==", "format": "wav"}})}, 400),
    ("image claiming 100000x100000", {"messages": _user({"type": "image_url", "image_url": {
        "url": data_url("image/png", _png_header(100_000, 100_000))}})}, 400),
    ("image of 0x0", {"messages": _user({"type": "image_url", "image_url": {
        "url": data_url("image/png", _png_header(0, 0))}})}, 400),
    ("path traversal", {"messages": _user({"type": "audio_url", "audio_url": {
        "url": "file:///MEDIA/../../../etc/passwd"}})}, 400),
    ("encoded traversal", {"messages": _user({"type": "audio_url", "audio_url": {
        "url": "file:///MEDIA/%2e%2e/%2e%2e/etc/passwd"}})}, 400),
    ("remote url", {"messages": _user({"type": "audio_url", "audio_url": {"url": "http://169.254.169.254/x"}})}, 400),
    ("messages a string", {"messages": "hi"}, 400),
    ("max_tokens a string", {"max_tokens": "many"}, 400),
    ("max_tokens negative", {"max_tokens": -5}, 400),
    ("max_tokens huge", {"max_tokens": 10**30}, 400),
    ("temperature NaN-ish", {"temperature": "NaN"}, 400),
    ("seed a float", {"seed": 1.5}, 400),
    ("content nested lists", {"messages": [{"role": "user", "content": [[[{"type": "text"}]]]}]}, 400),
    ("content a number", {"messages": [{"role": "user", "content": 42}]}, 400),
    ("part without its payload", {"messages": _user({"type": "input_audio"})}, 400),
    ("part with a null payload", {"messages": _user({"type": "image_url", "image_url": None})}, 400),
    ("unhonourable fields", {"logit_bias": {"1": 100}, "prediction": {"type": "content"}}, 400),
    ("modalities garbage", {"modalities": ["smell"]}, 400),
    ("10 MB of text", {"messages": [{"role": "user", "content": "x" * 10_000_000}]}, 413),
    ("repetition_penalty 1e300", {"repetition_penalty": 1e300}, 400),
    ("seed -1", {"seed": -1}, 400),
    ("seed 2**64", {"seed": 2**64}, 400),
    ("top_k 1e23", {"top_k": 1e23}, 400),
    ("top_k past the vocabulary", {"top_k": 10**6}, 400),
    ("a PNG header over garbage", {"messages": _user({"type": "image_url", "image_url": {
        "url": data_url("image/png", _png_header(64, 64) + b"garbage" * 100)}})}, 400),
    ("not an image at all", {"messages": _user({"type": "image_url", "image_url": {
        "url": data_url("image/png", b"GIF89a" + b"\0" * 100)}})}, 400),
]


@pytest.mark.parametrize(("case", "fields", "status"), HOSTILE, ids=[c[0] for c in HOSTILE])
def test_hostile_chat_bodies_are_4xx_json(server: LiveServer, case: str, fields: Body, status: int) -> None:
    body: Body = {"model": "fake-omni", "messages": [{"role": "user", "content": "hi"}], **fields}
    for part in body["messages"] if isinstance(body["messages"], list) else []:
        content = part.get("content") if isinstance(part, dict) else None
        for item in content if isinstance(content, list) else []:
            for key in ("audio_url",):
                if isinstance(item, dict) and isinstance(item.get(key), dict):
                    item[key]["url"] = item[key]["url"].replace("/MEDIA", str(server.media_dir))
    response = httpx.post(f"{server.base_url}/v1/chat/completions", json=body, timeout=30)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["message"] and error["type"] == "invalid_request_error"
    assert " object at 0x" not in error["message"]  # no heap addresses, no object reprs
    assert server.engine.requests == []  # nothing hostile reached the engine
    assert httpx.get(f"{server.base_url}/v1/models", timeout=10).status_code == 200


def _is_error_json(text: str) -> bool:
    try:
        return "error" in json.loads(text)
    except ValueError:
        return False


def test_schemathesis_finds_no_server_error(server: LiveServer) -> None:
    """Generated bodies for every operation in /openapi.json: never a 5xx, never a non-JSON error."""
    schemathesis = pytest.importorskip("schemathesis")
    from hypothesis import HealthCheck, given, settings

    schema = schemathesis.openapi.from_url(f"{server.base_url}/openapi.json")
    failures: list[str] = []
    calls: list[int] = []
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) >= 6
    for operation in operations:
        @settings(max_examples=25, deadline=None, database=None, suppress_health_check=list(HealthCheck))
        @given(case=operation.as_strategy())
        def check(case: object) -> None:
            response = case.call(base_url=server.base_url, timeout=30)
            calls.append(response.status_code)
            if response.status_code >= 500 or (response.status_code >= 400 and not _is_error_json(response.text)):
                failures.append(f"{case.operation.label}: {response.status_code} {response.text[:200]}")

        check()
    assert failures == [] and len(calls) >= 50
    assert httpx.get(f"{server.base_url}/health", timeout=10).status_code == 200


def _deep(depth: int) -> bytes:
    return b'{"model": "fake-omni", "messages": [{"role": "user", "content": ' + b"[" * depth + b"]" * depth + b"}]}"


# (case id, raw body): malformed at the JSON level, each a 400 in OpenAI's shape that shows no object repr
MALFORMED: list[tuple[str, bytes]] = [
    ("JSON nested 1000 deep", _deep(1000)),
    ("JSON nested 100000 deep", _deep(100_000)),
    ("a lone surrogate in content", b'{"model": "fake-omni", "messages": [{"role": "user", "content": "\\ud800"}]}'),
    ("a lone surrogate in a part", b'{"model": "fake-omni", "messages": [{"role": "user", "content": '
                                   b'[{"type": "text", "text": "a\\udfffb"}]}]}'),
    ("invalid UTF-8", b'{"model": "fake-omni", "messages": [{"role": "user", "content": "\xff\xfe"}]}'),
]


@pytest.mark.parametrize("content_type", ["application/json", None])
@pytest.mark.parametrize(("case", "raw"), MALFORMED, ids=[c[0] for c in MALFORMED])
def test_malformed_json_is_a_400_without_reprs(server: LiveServer, case: str, raw: bytes,
                                               content_type: str | None) -> None:
    headers = {"content-type": content_type} if content_type else {}
    response = httpx.post(f"{server.base_url}/v1/chat/completions", content=raw, timeout=30, headers=headers)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["type"] == "invalid_request_error"
    assert " object at 0x" not in response.text and "<" not in response.json()["error"]["message"]
    assert server.engine.requests == []
    assert httpx.get(f"{server.base_url}/health", timeout=10).status_code == 200


@pytest.mark.parametrize(("path", "raw"), [
    ("/v1/audio/speech", b'{"model": "fake-omni", "input": "hi \\ud800"}'),
    ("/v1/responses", b'{"model": "fake-omni", "input": "\\udc00"}'),
    ("/v1/chat/completions", b'{"model": "fake-omni", "messages": [{"role": "user", "content": "hi"}], '
                             b'"tools": [{"type": "function", "function": {"name": "f", "description": "\\ud83d"}}]}'),
])
def test_a_lone_surrogate_is_a_400_on_every_json_route(server: LiveServer, path: str, raw: bytes) -> None:
    response = httpx.post(f"{server.base_url}{path}", content=raw, timeout=30,
                          headers={"content-type": "application/json"})
    assert response.status_code == 400, response.text
    assert response.json()["error"]["code"] == "invalid_json"


@pytest.mark.parametrize("raw", [
    '{"type": "conversation.item.create", "item": {"type": "message", "role": "user", '
    '"content": [{"type": "input_text", "text": "hi \\ud800"}]}}',
    '{"type": "session.update", "session": {"instructions": "\\udfff"}}',
    '{"type": "session.update", "session": ' + "[" * 100_000 + "]" * 100_000 + "}",
])
def test_malformed_realtime_events_are_error_events_not_dropped_sockets(server: LiveServer, raw: str) -> None:
    import asyncio

    from tests.entrypoints.test_realtime import open_session, send, until

    async def scenario() -> None:
        async with await open_session(server) as ws:
            await ws.send(raw)
            error, _ = await until(ws, "error")
            assert error["error"]["code"] == "invalid_json" and " object at 0x" not in error["error"]["message"]
            await send(ws, {"type": "session.update", "session": {"instructions": "be brief"}})
            updated, _ = await until(ws, "session.updated")
            assert updated["session"]["instructions"] == "be brief"
    asyncio.run(scenario())


def test_stray_folders_in_the_voices_dir_are_no_voices(tmp_path) -> None:
    from omnistage.entrypoints.openai.speech.voice_store import META, VoiceStore

    store = VoiceStore(tmp_path, max_voices=4)
    (tmp_path / "stray").mkdir()  # no meta.json
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / META).write_text("{not json")
    (tmp_path / "half").mkdir()
    (tmp_path / "half" / META).write_text('{"name": "half"}')
    store.add("good", "x_vector", lambda folder: None)
    assert [v.name for v in store.list()] == ["good"]
