"""Realtime transcription on a Qwen3-ASR checkpoint: every session is a transcription session (opened as one,
with or without ``?intent=transcription``; a ``session.update`` to ``realtime`` is refused), committed audio is
written down by the recogniser as ``conversation.item.input_audio_transcription.delta``/``.completed`` (its
``language X<asr_text>`` markup never shown), the session's ``language`` and ``prompt`` go into its prompt, and
``response.create`` has nothing to answer with."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from websockets.asyncio.client import connect

from omnistage.audio.decode import resample
from tests.entrypoints.speech_sample import speech
from tests.entrypoints.test_realtime import pcm16_pieces
from tests.entrypoints.test_realtime_schemas import Recorder

pytestmark = pytest.mark.e2e
RATE = 24000
DONE = "conversation.item.input_audio_transcription.completed"


async def _session(url: str, intent: bool, transcription: dict[str, str]) -> list[dict]:
    samples, _ = speech("Hello world, this is a test.", RATE)
    async with connect(url.replace("http://", "ws://") + "/v1/realtime" + ("?intent=transcription" if intent else "")
                       ) as ws:
        s = Recorder(ws)
        created = await s.until("session.created")
        assert created["session"]["type"] == "transcription"
        await s.update({"type": "transcription", "audio": {"input": {"transcription": {"model": "asr", **transcription},
                                                                     "turn_detection": None}}})
        for piece in pcm16_pieces(samples, RATE):
            await s.send({"type": "input_audio_buffer.append", "audio": piece})
        await s.send({"type": "input_audio_buffer.commit"})
        await s.until(DONE)
        await s.send({"type": "session.update", "session": {"type": "realtime"}})
        await s.until("error")
        await s.send({"type": "response.create"})
        await s.until("error")
        return s.events


@pytest.mark.parametrize("intent", [True, False])
def test_a_recognisers_session_transcribes(asr_url: str, intent: bool) -> None:
    events = asyncio.run(_session(asr_url, intent, {"language": "en", "prompt": "Greetings."}))
    done = next(e for e in events if e["type"] == DONE)
    deltas = "".join(e["delta"] for e in events if e["type"] == "conversation.item.input_audio_transcription.delta")
    assert done["transcript"] and done["transcript"] == deltas.strip()
    errors = [e["error"] for e in events if e["type"] == "error"]
    assert "speech recogniser" in errors[0]["message"] and errors[0]["param"] == "session.type"


def test_the_session_language_and_prompt_reach_the_prompt(asr_url: str, asr_dir) -> None:
    """The transcript is the recogniser's greedy reply to the session's audio under the session's settings."""
    from tests.families.qwen3_asr.test_server import _expected

    events = asyncio.run(_session(asr_url, True, {"language": "de", "prompt": "Guten Tag."}))
    samples, _ = speech("Hello world, this is a test.", RATE)
    pcm = np.frombuffer((np.clip(samples, -1, 1) * 32767).astype("<i2").tobytes(), "<i2").astype(np.float32) / 32768
    heard = resample(pcm, RATE, 16000)
    done = next(e for e in events if e["type"] == DONE)
    assert done["transcript"] == _expected(asr_dir, heard, "de", "Guten Tag.")
