"""WebRTC calls on a Qwen3-ASR checkpoint: an aiortc peer speaks espeak-ng speech on its microphone track, and
the call, a transcription session, writes each turn the server VAD finds down on the ``oai-events`` data channel
(deltas while it is spoken, ``.completed`` after), answering nothing."""

from __future__ import annotations

import asyncio

import httpx
import numpy as np
import pytest

from omnistage.entrypoints.openai.webrtc.tracks import RATE
from tests.entrypoints.speech_sample import speech
from tests.entrypoints.test_webrtc import Client

pytestmark = pytest.mark.e2e
DELTA = "conversation.item.input_audio_transcription.delta"
DONE = "conversation.item.input_audio_transcription.completed"


def test_a_call_on_a_recogniser_writes_its_turns_down(asr_url: str) -> None:
    samples, _ = speech("The quick brown fox jumps over the lazy dog, then it runs away.", RATE)

    async def scenario() -> list[dict]:
        client = Client()
        async with httpx.AsyncClient(base_url=asr_url, timeout=30) as http:
            r = await client.connect(http, session={"type": "transcription", "audio": {"input": {
                "transcription": {"model": "asr", "language": "en"}}}})
            assert r.status_code == 201, r.text
            created = await client.event("session.created")
            assert created["session"]["type"] == "transcription"
            client.mic.push(np.concatenate([samples, np.zeros(RATE, np.float32)]))
            await client.event(DONE, timeout=90)
            await http.delete(client.location)
            await client.pc.close()
        return client.events

    events = asyncio.run(scenario())
    kinds = [e["type"] for e in events]
    assert not any(k.startswith("response.") for k in kinds), kinds
    item = next(e["item_id"] for e in events if e["type"] == "input_audio_buffer.committed")
    done = next(e for e in events if e["type"] == DONE)
    deltas = "".join(e["delta"] for e in events if e["type"] == DELTA and e["item_id"] == item)
    assert done["item_id"] == item and done["transcript"] and done["transcript"] == deltas.strip()
