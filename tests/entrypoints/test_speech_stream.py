"""``WS /v1/audio/speech/stream`` on a Qwen3-TTS checkpoint: text arriving in pieces is spoken sentence by sentence
as each completes, each sentence's audio the same as /v1/audio/speech makes for it; mistakes are error events."""

from __future__ import annotations

import asyncio
import base64
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


async def _session(url: str, events: list[dict]) -> list[dict]:
    from websockets.asyncio.client import connect

    received: list[dict] = []
    async with connect(url.replace("http://", "ws://") + "/v1/audio/speech/stream?model=tts", open_timeout=10,
                       max_size=None) as ws:
        for event in events:
            await ws.send(json.dumps(event))
        while not received or received[-1]["type"] not in ("speech.audio.done", "error"):
            received.append(json.loads(await asyncio.wait_for(ws.recv(), 60)))
    return received


def _pcm(events: list[dict], segment: int) -> torch.Tensor:
    data = b"".join(base64.b64decode(e["audio"]) for e in events
                    if e["type"] == "speech.audio.delta" and e["segment"] == segment)
    return torch.from_numpy(np.frombuffer(data, "<i2").astype(np.float32) / 32767)


def test_incremental_text_is_spoken_sentence_by_sentence(tts) -> None:  # noqa: F811
    pieces = ["Hello the", "re, how are", " you today? I am ", "fine, thank", " you."]
    events = [{"type": "session.update", "voice": "ryan"}]
    events += [{"type": "input_text.delta", "delta": p} for p in pieces] + [{"type": "input_text.done"}]
    got = asyncio.run(_session(tts.url, events))
    done = [e for e in got if e["type"] == "speech.segment.done"]
    assert [e["text"] for e in done] == ["Hello there, how are you today?", "I am fine, thank you."]
    assert got[-1]["type"] == "speech.audio.done" and got[-1]["usage"]["output_tokens"] == 2 * (FRAMES - 1)
    for segment, text in enumerate(e["text"] for e in done):
        whole = tts.speech(voice="ryan", input=text, response_format="pcm")
        expected = torch.from_numpy(np.frombuffer(whole.content, "<i2").astype(np.float32) / 32767)
        torch.testing.assert_close(_pcm(got, segment), expected, atol=2e-4, rtol=0)


def test_a_bad_voice_or_event_is_an_error_event(tts) -> None:  # noqa: F811
    got = asyncio.run(_session(tts.url, [{"type": "session.update", "voice": "nobody"},
                                         {"type": "input_text.delta", "delta": "Hi there. "}]))
    assert got[-1]["type"] == "error" and got[-1]["error"]["code"] == "invalid_voice"
    got = asyncio.run(_session(tts.url, [{"type": "nonsense"}]))
    assert got[-1]["type"] == "error" and "unknown event type" in got[-1]["error"]["message"]
