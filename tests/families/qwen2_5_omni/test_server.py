"""Qwen2.5-Omni through the same OpenAI server code as every family (tiny checkpoint, real pipeline in process):
chat with text + audio answers a WAV in the requested voice, and the voices listed are the checkpoint's; speech
(the thinker's spoken reply), transcription (the thinker) and a realtime session that speaks."""

from __future__ import annotations

import asyncio
import base64
import io
import wave
from pathlib import Path
from types import SimpleNamespace

import httpx
import numpy as np
import pytest

from omnistage.families.qwen2_5_omni.voices import SYSTEM_PROMPT
from omnistage.models.qwen2_5_omni.token2wav import SAMPLES_PER_CODE
from tests.entrypoints.test_realtime import open_session, send, spoken_like, until
from tests.families.qwen2_5_omni.specs import TALKER_TOKENS

pytestmark = pytest.mark.e2e


def test_chat_with_audio_answers_a_wav(base_url: str) -> None:
    body = {"model": "omni25", "modalities": ["text", "audio"], "audio": {"voice": "Chelsie", "format": "wav"},
            "messages": [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": "hi"}],
            "max_tokens": 6, "seed": 1}
    reply = httpx.post(f"{base_url}/v1/chat/completions", json=body, timeout=120)
    assert reply.status_code == 200, reply.text
    message = reply.json()["choices"][0]["message"]
    assert message["content"]
    with wave.open(io.BytesIO(base64.b64decode(message["audio"]["data"]))) as wav:
        assert wav.getframerate() == 24000 and wav.getnchannels() == 1
        assert 0 < wav.getnframes() <= TALKER_TOKENS * SAMPLES_PER_CODE


def test_the_checkpoints_voices_are_served(base_url: str) -> None:
    body = {"model": "omni25", "modalities": ["text", "audio"], "audio": {"voice": "Nobody", "format": "wav"},
            "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    assert httpx.post(f"{base_url}/v1/chat/completions", json=body, timeout=60).status_code == 400


def test_openai_voice_names_map_onto_the_checkpoints_speakers(base_url: str) -> None:
    models = httpx.get(f"{base_url}/", headers={"Accept": "application/json"}, timeout=10).json()
    assert {"Chelsie", "Ethan", "alloy", "onyx"} <= set(models["voices"])
    body = {"model": "omni25", "modalities": ["text", "audio"], "audio": {"voice": "onyx", "format": "wav"},
            "messages": [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": "hi"}],
            "max_tokens": 4, "seed": 1}
    assert httpx.post(f"{base_url}/v1/chat/completions", json=body, timeout=120).status_code == 200


def _wav(samples: np.ndarray, rate: int = 16000) -> bytes:
    out = io.BytesIO()
    with wave.open(out, "wb") as w:
        w.setnchannels(1), w.setsampwidth(2), w.setframerate(rate)
        w.writeframes((np.clip(samples, -1, 1) * 32767).astype("<i2").tobytes())
    return out.getvalue()


def test_speech_is_the_thinkers_spoken_reply(base_url: str) -> None:
    """No text-to-speech mode in Qwen2.5-Omni: the thinker is asked to repeat the input and the talker speaks it."""
    body = {"model": "omni25", "input": "Hello there", "voice": "Ethan", "response_format": "wav"}
    reply = httpx.post(f"{base_url}/v1/audio/speech", json=body, timeout=120)
    assert reply.status_code == 200, reply.text
    with wave.open(io.BytesIO(reply.content)) as wav:
        assert wav.getframerate() == 24000 and wav.getnframes() > 0


def test_transcription_through_the_thinker(base_url: str) -> None:
    files = {"file": ("hi.wav", _wav(spoken_like(1.0, 16000)), "audio/wav")}
    reply = httpx.post(f"{base_url}/v1/audio/transcriptions", data={"model": "omni25"}, files=files, timeout=120)
    assert reply.status_code == 200, reply.text
    assert isinstance(reply.json()["text"], str)


def test_a_realtime_session_speaks(base_url: str) -> None:
    server = SimpleNamespace(base_url=base_url)

    async def scenario() -> list[dict]:
        async with await open_session(server, audio={"output": {"voice": "Chelsie"}}) as ws:
            await send(ws, {"type": "conversation.item.create",
                            "item": {"role": "user", "content": [{"type": "input_text", "text": "hi"}]}})
            await send(ws, {"type": "response.create", "response": {"max_output_tokens": 4}})
            done, events = await until(ws, "response.done")
            assert done["response"]["status"] in ("completed", "incomplete"), done
            return events

    events = asyncio.run(scenario())
    pcm = b"".join(base64.b64decode(e["delta"]) for e in events if e["type"] == "response.output_audio.delta")
    assert len(pcm) > 0 and len(pcm) % 2 == 0


def test_bench_serve_accepts_the_family(base_url: str, omni25_dir: Path, tmp_path: Path) -> None:
    import json

    from omnistage.entrypoints.cli import main

    out = tmp_path / "serve.json"
    code = main(["bench", "serve", "--model", str(omni25_dir), "--url", base_url, "--served-model-name", "omni25",
                 "--concurrency", "1", "--num-prompts", "1", "--random-input-len", "8", "--output-tokens", "4",
                 "--warmup", "0", "--no-progress", "--json", str(out)])
    assert code == 0
    figures = json.loads(out.read_text())["concurrency"]["1"]
    assert figures["completed"] == 1 and figures["failed"] == 0 and figures["total_audio_s"] > 0
