"""``WS /v1/audio/speech/stream`` on a Qwen3-TTS checkpoint speaks text as it is written (its default,
``session.created`` says ``deltas``): the first audio comes while the text is still arriving, the whole is the
one-shot streaming-mode utterance of the same text (greedy tiny checkpoint: within 16-bit rounding), the vLLM-Omni
dialect gets it as one sentence, and a cancel stops the audio and ends the session."""

from __future__ import annotations

import asyncio
import base64
import json

import numpy as np
import pytest
import torch

from omnistage.families.qwen3_tts.offline import TTSSettings, generate_offline
from omnistage.models.qwen3_tts.checkpoint import Qwen3TTSModels
from omnistage.models.qwen3_tts.request import SpeechInput, TextTokenizer
from tests.entrypoints.test_speech_tts import FRAMES, TEXT, tts  # noqa: F401 - the served TTS checkpoint fixture

pytestmark = pytest.mark.e2e
PIECES = ["Hel", "lo the", "re, how", " are you", " to", "day?"]  # TEXT, cut inside words


def _url(tts) -> str:  # noqa: ANN001, F811
    return tts.url.replace("http://", "ws://") + "/v1/audio/speech/stream?model=tts"


def _pcm(events: list[dict]) -> torch.Tensor:
    data = b"".join(base64.b64decode(e["audio"]) for e in events if e["type"] == "speech.audio.delta")
    return torch.from_numpy(np.frombuffer(data, "<i2").astype(np.float32) / 32767)


async def _until(ws, kinds: tuple[str, ...], received: list[dict]) -> dict:  # noqa: ANN001
    while True:
        event = json.loads(await asyncio.wait_for(ws.recv(), 60))
        received.append(event)
        if event["type"] in kinds:
            return event


@pytest.fixture(scope="module")
def streaming_mode(tts) -> torch.Tensor:  # noqa: ANN001, F811
    """TEXT spoken offline in the reference's streaming mode (one text row per frame), on the served weights."""
    models = Qwen3TTSModels.load(tts.folder)
    return generate_offline(models, TextTokenizer(tts.folder), SpeechInput(TEXT, speaker="ryan", non_streaming=False),
                            TTSSettings(max_new_tokens=FRAMES)).wav


def test_audio_starts_before_the_text_ends_and_equals_the_one_shot_streaming_utterance(tts, streaming_mode) -> None:  # noqa: ANN001, F811
    from websockets.asyncio.client import connect

    async def session() -> tuple[list[dict], list[dict], int | None]:
        before: list[dict] = []
        async with connect(_url(tts), open_timeout=10, max_size=None) as ws:
            created = json.loads(await ws.recv())
            await ws.send(json.dumps({"type": "session.update", "voice": "ryan"}))
            for piece in PIECES[:-1]:
                await ws.send(json.dumps({"type": "input_text.delta", "delta": piece}))
            await _until(ws, ("speech.audio.delta",), before)  # the text has not ended yet
            await ws.send(json.dumps({"type": "input_text.delta", "delta": PIECES[-1]}))
            await ws.send(json.dumps({"type": "input_text.done"}))
            after = [json.loads(m) async for m in ws]
            return [created], before + after, ws.close_code

    created, events, code = asyncio.run(session())
    assert created[0]["session"]["text_input"] == "deltas" and code == 1000
    kinds = [e["type"] for e in events if e["type"] != "speech.audio.delta"]
    assert kinds == ["speech.segment.done", "speech.audio.done"], kinds
    assert events[-2]["text"] == TEXT and events[-1]["usage"]["output_tokens"] == FRAMES - 1
    torch.testing.assert_close(_pcm(events), streaming_mode, atol=2e-4, rtol=0)  # 16-bit samples
    whole = tts.speech(voice="ryan", response_format="pcm")  # /v1/audio/speech: the whole text in the prompt
    one_shot = torch.from_numpy(np.frombuffer(whole.content, "<i2").astype(np.float32) / 32767)
    assert one_shot.shape == streaming_mode.shape and (one_shot - streaming_mode).abs().max() > 1e-2


def test_the_vllm_omni_dialect_gets_the_utterance_as_one_sentence(tts) -> None:  # noqa: ANN001, F811
    from websockets.asyncio.client import connect

    async def session() -> tuple[list[dict], bytes]:
        events, audio = [], b""
        async with connect(_url(tts), open_timeout=10, max_size=None) as ws:
            await ws.send(json.dumps({"type": "session.config", "voice": "ryan", "response_format": "pcm"}))
            for piece in PIECES:
                await ws.send(json.dumps({"type": "input.text", "text": piece}))
            await ws.send(json.dumps({"type": "input.done"}))
            async for message in ws:
                if isinstance(message, bytes):
                    audio += message
                else:
                    events.append(json.loads(message))
        return events, audio

    events, audio = asyncio.run(session())
    assert [e["type"] for e in events] == ["session.created", "audio.start", "audio.done", "session.done"]
    assert events[2]["total_bytes"] == len(audio) == (FRAMES - 1) * 1920 * 2 and events[3]["total_sentences"] == 1


def test_a_cancel_stops_the_audio_and_ends_the_session(tts) -> None:  # noqa: ANN001, F811
    """The text never ends: once audio plays, a cancel ends the session (1000) with no audio after it."""
    from websockets.asyncio.client import connect

    async def session() -> tuple[list[dict], int | None]:
        received: list[dict] = []
        async with connect(_url(tts), open_timeout=10, max_size=None) as ws:
            for piece in PIECES[:-1]:
                await ws.send(json.dumps({"type": "input_text.delta", "delta": piece}))
            await _until(ws, ("speech.audio.delta",), received)
            await ws.send(json.dumps({"type": "input_text.cancel"}))
            mark = len(received)
            received += [json.loads(m) async for m in ws]
            return received[mark:], ws.close_code

    after, code = asyncio.run(session())
    assert code == 1000 and after[-1]["type"] == "speech.audio.done", after
    assert sum(e["type"] == "speech.audio.delta" for e in after) <= 1


def test_text_past_the_input_bound_is_refused_and_its_end_still_ends_the_utterance(tts) -> None:  # noqa: ANN001, F811
    """The utterance's text is bounded as one /v1/audio/speech input (--max-speech-input-chars): the piece that
    would cross it is an error event, what came before is spoken, and input_text.done still ends it."""
    from websockets.asyncio.client import connect

    async def session() -> tuple[list[dict], int | None]:
        async with connect(_url(tts), open_timeout=10, max_size=None) as ws:
            await ws.send(json.dumps({"type": "input_text.delta", "delta": "Hello there."}))
            await ws.send(json.dumps({"type": "input_text.delta", "delta": "x" * 5000}))
            await ws.send(json.dumps({"type": "input_text.done"}))
            return [json.loads(m) async for m in ws], ws.close_code

    events, code = asyncio.run(session())
    errors = [e["error"] for e in events if e["type"] == "error"]
    assert [e["code"] for e in errors] == ["input_too_long"] and "--max-speech-input-chars" in errors[0]["message"]
    assert code == 1000 and events[-1]["type"] == "speech.audio.done" and _pcm(events).numel() > 0
    assert [e["text"] for e in events if e["type"] == "speech.segment.done"] == ["Hello there."]


def test_the_bench_client_writes_at_its_pace_and_records_the_audio(tts) -> None:  # noqa: ANN001, F811
    """``bench speech-stream``'s client: LLM-sized pieces that join to the text, sent 1/rate apart; the audio it
    records is the utterance's, in the mode the server said."""
    from omnistage.tools.bench.speech_stream import llm_pieces, session, summarize

    pieces = llm_pieces(TEXT)
    assert "".join(pieces) == TEXT and max(len(p.strip()) for p in pieces) <= 4 and len(pieces) > len(TEXT.split())
    record, mode = asyncio.run(session(tts.url, "tts", "ryan", pieces, rate=100.0))
    assert mode == "deltas" and record.ok and record.audio_seconds == pytest.approx((FRAMES - 1) * 0.08)
    assert record.audio_ttfp is not None and record.audio_ttfp > 0
    figures = summarize([record], len(pieces) / 100.0)
    assert figures["errors"] == 0 and len(figures["first_audio_ms"]) == 1
