"""``WS /v1/audio/speech/stream`` on a Qwen3-TTS checkpoint asked to cut its text in sentences (``text_input``):
text arriving in pieces is spoken sentence by sentence as each completes, each sentence's audio the same as
/v1/audio/speech makes for it; mistakes are error events. Its default, text spoken as it is written:
``test_speech_stream_deltas.py``."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json

import numpy as np
import pytest
import torch

from omnistage.entrypoints.openai.speech.stream import cut_segments
from tests.entrypoints.test_speech_tts import FRAMES, tts  # noqa: F401 - the served TTS checkpoint fixture

pytestmark = pytest.mark.e2e


def test_segments_are_cut_at_sentence_ends_and_the_limit() -> None:
    assert cut_segments("Hello there. How are", 100) == (["Hello there."], " How are")
    assert cut_segments("Wait... what?", 100) == (["Wait..."], " what?")  # ends once what follows has begun
    assert cut_segments(" what?", 100, final=True) == (["what?"], "")
    assert cut_segments("abcdefghij", 4) == (["abcd", "efgh"], "ij")
    assert cut_segments("One\nTwo", 100) == (["One"], "Two")


async def _session(url: str, events: list[str | bytes | dict], until: tuple[str, ...] = ("speech.audio.done", "error"),
                   ) -> tuple[list[dict], int | None]:
    """Plays ``events`` and reads until an event of a type in ``until``, then to the close when that ended the
    session: the events received and the close code (None while still open)."""
    from websockets.asyncio.client import connect
    from websockets.exceptions import ConnectionClosed

    received: list[dict] = []
    async with connect(url.replace("http://", "ws://") + "/v1/audio/speech/stream?model=tts", open_timeout=10,
                       max_size=None) as ws:
        for event in events:
            await ws.send(json.dumps(event) if isinstance(event, dict) else event)
        while not received or received[-1]["type"] not in until:
            received.append(json.loads(await asyncio.wait_for(ws.recv(), 60)))
        if received[-1]["type"] == "speech.audio.done":
            with contextlib.suppress(ConnectionClosed):
                await asyncio.wait_for(ws.recv(), 10)
        return received, ws.close_code


def _pcm(events: list[dict], segment: int) -> torch.Tensor:
    data = b"".join(base64.b64decode(e["audio"]) for e in events
                    if e["type"] == "speech.audio.delta" and e["segment"] == segment)
    return torch.from_numpy(np.frombuffer(data, "<i2").astype(np.float32) / 32767)


def test_incremental_text_is_spoken_sentence_by_sentence(tts) -> None:  # noqa: F811
    pieces = ["Hello the", "re, how are", " you today? I am ", "fine, thank", " you."]
    events = [{"type": "session.update", "voice": "ryan", "text_input": "sentences"}]
    events += [{"type": "input_text.delta", "delta": p} for p in pieces] + [{"type": "input_text.done"}]
    got, code = asyncio.run(_session(tts.url, events))
    assert code == 1000
    done = [e for e in got if e["type"] == "speech.segment.done"]
    assert [e["text"] for e in done] == ["Hello there, how are you today?", "I am fine, thank you."]
    assert got[-1]["type"] == "speech.audio.done" and got[-1]["usage"]["output_tokens"] == 2 * (FRAMES - 1)
    for segment, text in enumerate(e["text"] for e in done):
        whole = tts.speech(voice="ryan", input=text, response_format="pcm")
        expected = torch.from_numpy(np.frombuffer(whole.content, "<i2").astype(np.float32) / 32767)
        torch.testing.assert_close(_pcm(got, segment), expected, atol=2e-4, rtol=0)


def test_client_errors_are_error_events_and_the_session_goes_on(tts) -> None:  # noqa: F811
    """Each mistake is an error event on the open socket; the settings stay as they were and the text that
    follows is spoken, then the session ends as usual (1000)."""
    events: list[str | bytes | dict] = [
        {"type": "nonsense"}, "not json", b"\x00binary", '{"type": "input_text.delta", "delta": "\\ud800"}',
        {"type": "input_text.delta", "delta": 5}, {"type": "session.update", "voice": "nobody"},
        {"type": "session.update", "voice": "ryan", "text_input": "sentences"},
        {"type": "input_text.delta", "delta": "Hello there. "},
        {"type": "input_text.done"}]
    got, code = asyncio.run(_session(tts.url, events, until=("speech.audio.done",)))
    errors = [e["error"] for e in got if e["type"] == "error"]
    assert [e["code"] for e in errors] == ["invalid_event"] * 5 + ["invalid_voice"], errors
    assert "unknown event type" in errors[0]["message"] and "surrogate" in errors[3]["message"]
    assert [e["text"] for e in got if e["type"] == "speech.segment.done"] == ["Hello there."]
    assert got[-1]["usage"]["output_tokens"] == FRAMES - 1 and code == 1000
    whole = tts.speech(voice="ryan", input="Hello there.", response_format="pcm")
    expected = torch.from_numpy(np.frombuffer(whole.content, "<i2").astype(np.float32) / 32767)
    torch.testing.assert_close(_pcm(got, 0), expected, atol=2e-4, rtol=0)  # spoken with the accepted voice


def test_an_error_then_a_valid_request_is_served(tts) -> None:  # noqa: F811
    """After the error the same socket is still read: a question asked after it is answered."""
    async def scenario() -> tuple[list[dict], list[dict]]:
        from websockets.asyncio.client import connect

        url = tts.url.replace("http://", "ws://") + "/v1/audio/speech/stream?model=tts"
        async with connect(url, open_timeout=10, max_size=None) as ws:
            await ws.send(json.dumps({"type": "session.update", "voice": "nobody"}))
            created = json.loads(await asyncio.wait_for(ws.recv(), 60))
            assert created["type"] == "session.created" and created["session"]["text_input"] == "deltas"
            first = json.loads(await asyncio.wait_for(ws.recv(), 60))  # answered before anything else is sent
            for event in ({"type": "input_text.delta", "delta": "Hi there."}, {"type": "input_text.done"}):
                await ws.send(json.dumps(event))
            rest = [json.loads(m) async for m in ws]
        return [first], rest

    first, rest = asyncio.run(scenario())
    assert first[0]["type"] == "error" and first[0]["error"]["code"] == "invalid_voice"
    assert [e["type"] for e in rest if e["type"] != "speech.audio.delta"] == ["speech.segment.done",
                                                                              "speech.audio.done"]
