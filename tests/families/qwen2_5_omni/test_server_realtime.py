"""``WS /v1/realtime`` on a Qwen2.5-Omni checkpoint (tiny, real pipeline in process, the session's server:
``conftest.base_url``): a spoken turn (espeak-ng speech appended in 100 ms pieces) found by the server's VAD is
committed, written down by the thinker, and answered with audio and its transcript, in OpenAI's event order; a
turn the client commits (24 kHz, resampled) answered in text; a transcription session writing a turn down; a
spoken turn served from the prefix cache (the earlier turns; with streaming input, the turn itself, prefilled
while it arrived); a session's instructions starting as the system prompt the talker was trained under."""

from __future__ import annotations

import asyncio
import base64
from types import SimpleNamespace

import numpy as np
import pytest

from omnistage.families.qwen2_5_omni.voices import SYSTEM_PROMPT
from omnistage.models.qwen2_5_omni.token2wav import SAMPLES_PER_CODE
from tests.entrypoints.speech_sample import speech
from tests.entrypoints.test_realtime import open_session, pcm16_pieces, send, stream_audio, until
from tests.families.qwen2_5_omni.specs import TALKER_TOKENS

pytestmark = pytest.mark.e2e
RATE = 16000
VAD = {"type": "server_vad", "silence_duration_ms": 500, "prefix_padding_ms": 300}


@pytest.fixture(scope="module")
def spoken() -> np.ndarray:
    """Half a second of silence, a spoken sentence (espeak-ng), then a second of silence: one turn."""
    samples, _ = speech("What is the weather like today?", RATE)
    silence = np.zeros(RATE // 2, np.float32)
    return np.concatenate([silence, samples, silence, silence])


def _index(kinds: list[str], kind: str) -> int:
    assert kind in kinds, kinds
    return kinds.index(kind)


def test_a_spoken_turn_is_heard_transcribed_and_answered(base_url: str, spoken: np.ndarray) -> None:
    session = {"instructions": SYSTEM_PROMPT, "max_output_tokens": 6,
               "audio": {"input": {"format": {"type": "audio/pcm", "rate": RATE}, "turn_detection": VAD,
                                   "transcription": {"model": "omni25"}},
                         "output": {"voice": "Ethan"}}}

    async def scenario() -> tuple[dict, list[dict]]:
        async with await open_session(SimpleNamespace(base_url=base_url), **session) as ws:
            await stream_audio(ws, spoken, RATE)
            done, events = await until(ws, "response.done")
            if not any(e["type"] == "conversation.item.input_audio_transcription.completed" for e in events):
                transcribed, more = await until(ws, "conversation.item.input_audio_transcription.completed")
                events += [*more, transcribed]
            return done, events

    done, events = asyncio.run(scenario())
    kinds = [e["type"] for e in events]
    started = _index(kinds, "input_audio_buffer.speech_started")
    stopped = _index(kinds, "input_audio_buffer.speech_stopped")
    committed, created = _index(kinds, "input_audio_buffer.committed"), _index(kinds, "response.created")
    first_audio = _index(kinds, "response.output_audio.delta")
    assert started < stopped < committed < created < first_audio
    # The VAD found the speech where it is: after the leading half second, ending before the trailing silence.
    speech_ms = 1000 * (len(spoken) - 3 * RATE // 2) / RATE
    assert 300 <= events[started]["audio_start_ms"] <= 800
    assert events[stopped]["audio_end_ms"] <= 500 + speech_ms + 600

    pcm = b"".join(base64.b64decode(e["delta"]) for e in events if e["type"] == "response.output_audio.delta")
    samples = np.frombuffer(pcm, "<i2")
    assert 0 < len(samples) <= TALKER_TOKENS * SAMPLES_PER_CODE and np.abs(samples).max() > 0
    transcript = "".join(e["delta"] for e in events if e["type"] == "response.output_audio_transcript.delta")
    assert transcript and done["response"]["status"] in ("completed", "incomplete")
    (content,) = done["response"]["output"][0]["content"]
    assert content["type"] == "output_audio" and content["transcript"] == transcript
    assert done["response"]["usage"]["input_tokens"] > 25 * speech_ms / 1000  # the turn's audio: 25 tokens a second

    (heard,) = [e for e in events if e["type"] == "conversation.item.input_audio_transcription.completed"]
    assert heard["item_id"] == events[committed]["item_id"] and heard["transcript"].strip()


def test_a_committed_turn_answers_in_text(base_url: str, spoken: np.ndarray) -> None:
    """No turn detection: the client commits the buffer (24 kHz, the default format) and asks a text answer."""
    from omnistage.audio.decode import resample

    async def scenario() -> tuple[dict, list[dict]]:
        async with await open_session(SimpleNamespace(base_url=base_url), output_modalities=["text"],
                                      audio={"input": {"turn_detection": None}}) as ws:
            await stream_audio(ws, resample(spoken, RATE, 24000), 24000)
            await send(ws, {"type": "input_audio_buffer.commit"})
            await send(ws, {"type": "response.create", "response": {"max_output_tokens": 5}})
            return await until(ws, "response.done")

    done, events = asyncio.run(scenario())
    kinds = [e["type"] for e in events]
    assert _index(kinds, "input_audio_buffer.committed") < _index(kinds, "response.created")
    assert not any(k.startswith("response.output_audio") for k in kinds)
    text = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
    assert text and done["response"]["output"][0]["content"][0]["text"] == text
    assert 0 < done["response"]["usage"]["output_tokens"] <= 5


def test_a_transcription_session_writes_each_turn_down(base_url: str, spoken: np.ndarray) -> None:
    async def scenario() -> list[dict]:
        async with await open_session(SimpleNamespace(base_url=base_url), type="transcription",
                                      audio={"input": {"format": {"type": "audio/pcm", "rate": RATE},
                                                       "turn_detection": VAD, "transcription": {"model": "omni25"}}},
                                      ) as ws:
            await stream_audio(ws, spoken, RATE)
            done, events = await until(ws, "conversation.item.input_audio_transcription.completed")
            return [*events, done]

    events = asyncio.run(scenario())
    kinds = [e["type"] for e in events]
    assert not any(k.startswith("response.") for k in kinds)
    deltas = "".join(e["delta"] for e in events if e["type"] == "conversation.item.input_audio_transcription.delta")
    assert events[-1]["transcript"].strip() and events[-1]["transcript"] == deltas
    assert events[-1]["item_id"] == events[_index(kinds, "input_audio_buffer.committed")]["item_id"]


def _commit_turns(base_url: str, turns: list[np.ndarray]) -> list[dict]:
    """Each turn appended, committed and answered with audio in one session; each response.done's usage."""
    session = {"instructions": SYSTEM_PROMPT, "max_output_tokens": 4,
               "audio": {"input": {"format": {"type": "audio/pcm", "rate": RATE}, "turn_detection": None}}}

    async def scenario() -> list[dict]:
        usages = []
        async with await open_session(SimpleNamespace(base_url=base_url), **session) as ws:
            for turn in turns:
                await stream_audio(ws, turn, RATE)
                await send(ws, {"type": "input_audio_buffer.commit"})
                await send(ws, {"type": "response.create"})
                done, events = await until(ws, "response.done")
                assert any(e["type"] == "response.output_audio.delta" for e in events)
                usages.append(done["response"]["usage"])
        return usages

    return asyncio.run(scenario())


def test_a_spoken_turn_reuses_the_earlier_turns_from_the_cache(base_url: str, spoken: np.ndarray) -> None:
    """A spoken reply's prompt is served from the thinker's prefix cache (the talker's rows of cached positions
    kept beside the KV): turn 2 re-reads turn 1 from it."""
    first, second = _commit_turns(base_url, [0.8 * spoken[:RATE * 3], 0.8 * spoken[RATE * 3:]])
    assert second["input_token_details"]["cached_tokens"] >= first["input_tokens"] // 16 * 16 > 0


def test_streaming_input_prefills_the_turn_while_it_is_spoken(base_url: str) -> None:
    """A 5 s turn sent at twice real time: the 2 s chunks it completes are prefilled while it arrives, so its
    reply finds them cached, where the same turn unstreamed finds only the instructions."""
    samples, _ = speech("One two three four five six seven eight nine ten, eleven twelve thirteen fourteen.", RATE)
    turn = np.concatenate([np.zeros(RATE // 2, np.float32), 0.7 * samples[:5 * RATE], np.zeros(RATE, np.float32)])

    async def scenario(streaming: bool) -> dict:
        # No speculative reply (it would commit the turn as it stood at a pause): the windows' prefills alone.
        session = {"instructions": SYSTEM_PROMPT, "max_output_tokens": 4, "streaming_input": streaming,
                   "speculative_reply_ms": 0,
                   "audio": {"input": {"format": {"type": "audio/pcm", "rate": RATE}, "turn_detection": VAD}}}
        async with await open_session(SimpleNamespace(base_url=base_url), **session) as ws:
            for piece in pcm16_pieces(turn, RATE):
                await send(ws, {"type": "input_audio_buffer.append", "audio": piece})
                await asyncio.sleep(0.05)
            done, _ = await until(ws, "response.done")
            return done["response"]["usage"]

    whole, streamed = asyncio.run(scenario(False)), asyncio.run(scenario(True))
    cached = whole["input_token_details"]["cached_tokens"], streamed["input_token_details"]["cached_tokens"]
    print(f"\nprompt {streamed['input_tokens']} tokens, cached: unstreamed {cached[0]}, streamed {cached[1]}")
    assert whole["input_tokens"] == streamed["input_tokens"] and cached[1] >= cached[0] + 32


def test_a_session_opens_under_the_talkers_system_prompt(base_url: str) -> None:
    """The family declares the system prompt its talker was trained under: a session's instructions until the
    client sets its own."""
    from websockets.asyncio.client import connect

    from tests.entrypoints.test_realtime import recv

    async def scenario() -> tuple[dict, dict]:
        async with connect(base_url.replace("http://", "ws://") + "/v1/realtime") as ws:
            created = await recv(ws)
            await send(ws, {"type": "session.update", "session": {"instructions": "Be brief."}})
            updated, _ = await until(ws, "session.updated")
            return created["session"], updated["session"]

    created, updated = asyncio.run(scenario())
    assert created["instructions"] == SYSTEM_PROMPT and updated["instructions"] == "Be brief."
