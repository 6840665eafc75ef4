"""/v1/audio/speech is real text-to-speech when a Qwen3-TTS checkpoint is served: ``voice`` is a CustomVoice
speaker, every response format and both stream formats carry the talker's audio, and what a TTS checkpoint
cannot do (chat, unknown voices) is a clear 400."""

from __future__ import annotations

import asyncio
import base64
import io
import json
from pathlib import Path

import httpx
import numpy as np
import pytest
import soundfile as sf
import torch

from omnistage.entrypoints.openai.api_server import build_app
from omnistage.models.qwen3_tts.checkpoint import Qwen3TTSModels
from omnistage.families.qwen3_tts.offline import TTSSettings, generate_offline
from omnistage.models.qwen3_tts.request import SpeechInput, TextTokenizer
from omnistage.pipeline.async_omni import AsyncOmni
from omnistage.pipeline.runtime import PipelineOptions
from tests.audio.signals import av_decode
from tests.entrypoints.server_thread import ServerThread
from tests.pipeline.specs import tts_small_dict, write_spec

pytestmark = pytest.mark.e2e
FRAMES = 12  # the served generation config's max_new_tokens: 11 frames of audio
TEXT = "Hello there, how are you today?"


class _Served:
    def __init__(self, url: str, folder: Path) -> None:
        self.url, self.folder = url, folder

    def speech(self, **body: object) -> httpx.Response:
        return httpx.post(f"{self.url}/v1/audio/speech", json={"model": "tts", "input": TEXT, **body}, timeout=120)


@pytest.fixture(scope="module")
def tts(tmp_path_factory: pytest.TempPathFactory):
    from omnistage.families.qwen3_tts.make_tiny import make_tiny_tts

    folder = make_tiny_tts(tmp_path_factory.mktemp("tts"), seed=0, tts_model_type="custom_voice")
    # Greedy with the reference's penalty, and a short answer: what the checkpoint's generation config says.
    (folder / "generation_config.json").write_text(json.dumps(
        {"do_sample": False, "top_k": 50, "repetition_penalty": 1.05, "max_new_tokens": FRAMES}))
    config = write_spec(tmp_path_factory.mktemp("stages"), tts_small_dict())
    engine = AsyncOmni(folder, config, PipelineOptions(in_process=True), "tts")
    thread = ServerThread(build_app(engine))
    try:
        yield _Served(thread.start(), folder)
    finally:
        thread.stop()
        asyncio.run(engine.shutdown())


@pytest.fixture(scope="module")
def offline(tts: _Served) -> torch.Tensor:
    """The same utterance generated offline on the same weights."""
    models = Qwen3TTSModels.load(tts.folder)
    return generate_offline(models, TextTokenizer(tts.folder), SpeechInput(TEXT, speaker="ryan"),
                            TTSSettings(max_new_tokens=FRAMES)).wav


def test_wav_is_the_offline_generation(tts: _Served, offline: torch.Tensor) -> None:
    r = tts.speech(voice="Ryan", response_format="wav")
    assert r.status_code == 200, r.text
    assert r.headers["content-type"] == "audio/wav"
    samples, rate = sf.read(io.BytesIO(r.content), dtype="float32")
    assert rate == 24000 and samples.shape == ((FRAMES - 1) * 1920,)
    torch.testing.assert_close(torch.from_numpy(samples), offline, atol=1e-4, rtol=0)  # 16-bit samples


def test_sse_streams_the_same_audio_with_usage(tts: _Served, offline: torch.Tensor) -> None:
    r = tts.speech(voice="ryan", response_format="pcm", stream_format="sse")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    events = [json.loads(line[len("data: "):]) for line in r.text.splitlines() if line.startswith("data: ")]
    deltas = [e for e in events if e["type"] == "speech.audio.delta"]
    assert len(deltas) >= 2  # streamed in pieces as the chunks were decoded
    pcm = np.frombuffer(b"".join(base64.b64decode(e["audio"]) for e in deltas), "<i2").astype(np.float32) / 32767
    torch.testing.assert_close(torch.from_numpy(pcm), offline, atol=1e-4, rtol=0)
    done = events[-1]
    assert done["type"] == "speech.audio.done"
    assert done["usage"]["output_tokens"] == FRAMES - 1 and done["usage"]["input_tokens"] > 0


@pytest.mark.parametrize("fmt", ["mp3", "flac", "opus", "aac"])
def test_every_response_format(tts: _Served, fmt: str) -> None:
    r = tts.speech(voice="vivian", response_format=fmt)
    assert r.status_code == 200, r.text
    samples, rate = av_decode(r.content)
    assert rate == 24000 or fmt == "opus"
    assert samples.size >= 0.5 * (FRAMES - 1) * 1920 * rate / 24000


def test_openai_voice_names_map_onto_the_speakers(tts: _Served) -> None:
    assert tts.speech(voice="alloy", response_format="pcm").status_code == 200


def test_what_a_tts_checkpoint_cannot_do_is_a_clear_400(tts: _Served) -> None:
    r = tts.speech(voice="nobody", response_format="pcm")
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_voice"
    assert "ryan" in r.json()["error"]["message"]
    chat = httpx.post(f"{tts.url}/v1/chat/completions", json={"model": "tts", "messages": [
        {"role": "user", "content": "hi"}]}, timeout=30)
    assert chat.status_code == 400 and chat.json()["error"]["code"] == "chat_not_supported"
    assert httpx.get(f"{tts.url}/v1/models", timeout=30).json()["data"][0]["id"] == "tts"
    voices = httpx.post(f"{tts.url}/v1/audio/voices", json={"name": "v", "audio": {"data": ""}}, timeout=30)
    assert voices.status_code == 400 and voices.json()["error"]["code"] == "voice_cloning_not_supported"


def test_the_realtime_socket_is_refused(tts: _Served) -> None:
    from websockets.asyncio.client import connect

    async def first_event() -> dict:
        async with connect(tts.url.replace("http://", "ws://") + "/v1/realtime", open_timeout=10) as ws:
            return json.loads(await asyncio.wait_for(ws.recv(), 10))

    event = asyncio.run(first_event())
    assert event["type"] == "error" and event["error"]["code"] == "chat_not_supported"
