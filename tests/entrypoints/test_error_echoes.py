"""Error messages name the field or the limit: never a library's own text (PyAV's errno, libsndfile's), never the
voices other users registered, never a huge value sent back whole (issue 51, row 9)."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest
from websockets.asyncio.client import connect

from tests.entrypoints.conftest import LiveServer
from tests.entrypoints.media_samples import b64

HUGE = "m" * 1_000_000
LIBRARY_WORDS = ("Errno", "Invalid data found", "LibsndfileError", "Format not recognised", "Error opening",
                 "Incorrect padding", "Only base64 data", "not allowed")


def _message(reply: httpx.Response) -> str:
    return reply.json()["error"]["message"]


def test_quoted_cuts_a_long_value_and_says_how_long() -> None:
    from omnistage.entrypoints.openai.common.errors import ECHO_CHARS, quoted

    assert quoted("tiny") == "'tiny'"
    cut = quoted(HUGE)
    assert len(cut) < ECHO_CHARS + 40 and "1000000 characters" in cut


@pytest.mark.parametrize("path, body", [
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}),
    ("/v1/responses", {"input": "hi"}),
    ("/v1/audio/speech", {"input": "hi"}),
])
def test_a_huge_model_name_is_not_echoed(server: LiveServer, path: str, body: dict) -> None:
    reply = httpx.post(f"{server.base_url}{path}", json={"model": HUGE, **body}, timeout=30)
    assert reply.status_code == 404 and reply.json()["error"]["code"] == "model_not_found"
    assert len(reply.text) < 1000 and "1000000 characters" in _message(reply)


def test_a_huge_model_name_is_not_echoed_on_the_realtime_socket(server: LiveServer) -> None:
    async def scenario() -> dict:
        url = server.base_url.replace("http://", "ws://") + "/v1/realtime?model=" + "m" * 4000
        async with connect(url, max_size=None) as ws:
            return json.loads(await asyncio.wait_for(ws.recv(), 20))
    event = asyncio.run(scenario())
    assert event["error"]["code"] == "model_not_found" and len(json.dumps(event)) < 1000


def test_huge_item_ids_and_event_types_are_not_echoed(server: LiveServer) -> None:
    async def scenario() -> list[dict]:
        url = server.base_url.replace("http://", "ws://") + "/v1/realtime"
        errors = []
        async with connect(url, max_size=None) as ws:
            await ws.recv()  # session.created
            for event in ({"type": "conversation.item.retrieve", "item_id": HUGE},
                          {"type": "conversation.item.delete", "item_id": HUGE},
                          {"type": HUGE}):
                await ws.send(json.dumps(event))
                errors.append(json.loads(await asyncio.wait_for(ws.recv(), 20)))
        return errors
    for error in asyncio.run(scenario()):
        assert error["type"] == "error" and len(json.dumps(error)) < 2000, error["error"]["code"]


def test_undecodable_audio_names_no_library_text(server: LiveServer) -> None:
    """PyAV's "[Errno 1094995529] Invalid data found when processing input" and libsndfile's "Error opening
    <_io.BytesIO ...>: Format not recognised" stay in the server's log."""
    junk = b"\x00\x01junk that is no audio at all" * 50
    transcription = httpx.post(f"{server.base_url}/v1/audio/transcriptions", data={"model": "fake-omni"},
                               files={"file": ("a.wav", junk, "audio/wav")}, timeout=30)
    part = {"type": "input_audio", "input_audio": {"data": b64(junk), "format": "wav"}}
    chat = httpx.post(f"{server.base_url}/v1/chat/completions", timeout=30, json={
        "model": "fake-omni", "messages": [{"role": "user", "content": [part]}]})
    mp3 = httpx.post(f"{server.base_url}/v1/chat/completions", timeout=30, json={
        "model": "fake-omni", "messages": [{"role": "user", "content": [
            {"type": "input_audio", "input_audio": {"data": b64(junk), "format": "mp3"}}]}]})
    bad_base64 = httpx.post(f"{server.base_url}/v1/chat/completions", timeout=30, json={
        "model": "fake-omni", "messages": [{"role": "user", "content": [
            {"type": "input_audio", "input_audio": {"data": "QUJD=A==", "format": "wav"}}]}]})
    for reply in (transcription, chat, mp3, bad_base64):
        assert reply.status_code == 400, reply.text
        assert not any(word in _message(reply) for word in LIBRARY_WORDS), _message(reply)


def test_a_realtime_append_of_bad_base64_names_no_library_text(server: LiveServer) -> None:
    async def scenario() -> dict:
        url = server.base_url.replace("http://", "ws://") + "/v1/realtime"
        async with connect(url, max_size=None) as ws:
            await ws.recv()
            await ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": "QUJD=A=="}))
            return json.loads(await asyncio.wait_for(ws.recv(), 20))
    error = asyncio.run(scenario())["error"]
    assert error["code"] == "invalid_audio" and not any(word in error["message"] for word in LIBRARY_WORDS)
