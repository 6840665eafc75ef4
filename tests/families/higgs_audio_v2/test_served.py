"""Higgs Audio v2 served: /v1/audio/speech through the OpenAI SDK (whole files in every format, streamed bytes,
SSE), cloning from ``ref_audio``/``ref_text`` and from a voice uploaded to the voices API, on a random tiny
checkpoint; the served audio is the offline generation's, decoded whole."""

from __future__ import annotations

import asyncio
import base64
import io
import json

import httpx
import numpy as np
import openai
import pytest
import soundfile as sf
import torch

from omnistage.entrypoints.openai.server_config import ServingOptions
from omnistage.families.higgs_audio_v2.checkpoint import load_codec, load_model
from omnistage.families.higgs_audio_v2.config import HiggsCheckpoint
from omnistage.families.higgs_audio_v2.delay import undelay
from omnistage.families.higgs_audio_v2.make_tiny import make_tiny_higgs
from omnistage.families.higgs_audio_v2.prompt import HiggsTokenizer
from omnistage.families.higgs_audio_v2.runner import generate_rows
from omnistage.pipeline.async_omni import AsyncOmni
from omnistage.pipeline.runtime import PipelineOptions
from omnistage.sampling_params import SamplingParams
from tests.audio.signals import av_decode
from tests.entrypoints.server_thread import serving
from tests.families.speech_server import speak_concurrently_as_alone, ws_session

pytestmark = pytest.mark.e2e
FRAMES = 60  # 52 audio frames once the staircase's 8 are de-delayed: more than one 50-frame chunk
TEXT = "hello there, how are you today"
REF_TEXT = "the quick brown fox"


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    folder = make_tiny_higgs(tmp_path_factory.mktemp("higgs"))
    (folder / "generation_config.json").write_text(json.dumps({"do_sample": False, "max_new_tokens": FRAMES}))
    engine = AsyncOmni(folder, None, PipelineOptions(in_process=True), "higgs")
    with serving(engine, serving=ServingOptions(voices_dir=tmp_path_factory.mktemp("voices"))) as url:
        yield url, folder


def speak_offline(folder, text: str, voice: torch.Tensor | None = None, ref_text: str = "") -> np.ndarray:
    """The utterance generated and decoded whole offline on the same weights."""
    ckpt = HiggsCheckpoint.from_folder(folder)
    prompt = HiggsTokenizer(folder, ckpt.model).prompt(text, voice, ref_text)
    rows = generate_rows(load_model(folder, ckpt), prompt, SamplingParams(temperature=0.0), FRAMES)
    with torch.inference_mode():
        return load_codec(folder).decode(undelay(rows, ckpt.model.delays).T[None])[0].numpy()


def reference_wav(seconds: float = 1.0) -> bytes:
    t = np.arange(int(24000 * seconds)) / 24000
    buf = io.BytesIO()
    sf.write(buf, (0.3 * np.sin(2 * np.pi * 220 * t)).astype(np.float32), 24000, format="WAV")
    return buf.getvalue()


def voice_codes(folder, wav: bytes) -> torch.Tensor:
    samples, _ = sf.read(io.BytesIO(wav), dtype="float32")
    return load_codec(folder, encoder=True).encode(torch.from_numpy(samples))


@pytest.fixture(scope="module")
def offline(served) -> np.ndarray:
    return speak_offline(served[1], TEXT)


def _client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0)


def _pcm(data: bytes) -> np.ndarray:
    return np.frombuffer(data, "<i2").astype(np.float32) / 32767


def _near(samples: np.ndarray, offline: np.ndarray) -> None:
    """Streamed chunks are windows of the non-causal decoder: within its bound of the whole decode (and pcm16's
    rounding) of it."""
    assert samples.shape == offline.shape
    np.testing.assert_allclose(samples, np.clip(offline, -1, 1), atol=2 / 32767 + 1e-3 * np.abs(offline).max())


def test_wav_is_the_offline_generation(served, offline):
    url, _ = served
    data = _client(url).audio.speech.create(model="higgs", voice="alloy", input=TEXT, response_format="wav").content
    samples, rate = sf.read(io.BytesIO(data), dtype="float32")
    assert rate == 24000 and len(samples) == (FRAMES - 8) * 960
    _near(samples, offline)


@pytest.mark.parametrize("fmt", ["mp3", "flac", "opus", "aac", "pcm"])
def test_every_format_carries_the_audio(served, offline, fmt):
    url, _ = served
    data = _client(url).audio.speech.create(model="higgs", voice="alloy", input=TEXT, response_format=fmt).content
    if fmt == "pcm":
        _near(_pcm(data), offline)
    else:
        samples, rate = av_decode(data)
        assert abs(len(samples) / rate - len(offline) / 24000) < 0.1  # encoder frame padding; opus is 48 kHz


def test_streamed_sse_deltas_join_to_the_whole(served, offline):
    url, _ = served
    with _client(url).audio.speech.with_streaming_response.create(
            model="higgs", voice="alloy", input=TEXT, response_format="pcm", stream_format="sse") as r:
        events = [json.loads(line[len("data: "):]) for line in r.iter_lines() if line.startswith("data: ")]
    deltas = [base64.b64decode(e["audio"]) for e in events if e["type"] == "speech.audio.delta"]
    assert len(deltas) >= 2
    _near(_pcm(b"".join(deltas)), offline)


def test_streamed_bytes(served, offline):
    url, _ = served
    with _client(url).audio.speech.with_streaming_response.create(model="higgs", voice="alloy", input=TEXT,
                                                                  response_format="pcm") as r:
        _near(_pcm(b"".join(r.iter_bytes())), offline)


def test_ref_audio_clones_the_voice(served):
    """vLLM-Omni's shape: ``ref_audio`` (a data: URL) and ``ref_text`` put the voice's codes and transcript in the
    prompt; the audio is what the same clone speaks offline, and not the default voice's."""
    url, folder = served
    wav = reference_wav()
    body = {"model": "higgs", "input": TEXT, "response_format": "pcm",
            "ref_audio": "data:audio/wav;base64," + base64.b64encode(wav).decode(), "ref_text": REF_TEXT}
    reply = httpx.post(f"{url}/v1/audio/speech", json=body, timeout=120)
    assert reply.status_code == 200, reply.text
    cloned = speak_offline(folder, TEXT, voice_codes(folder, wav), REF_TEXT)
    _near(_pcm(reply.content), cloned)
    assert np.abs(cloned - speak_offline(folder, TEXT)).max() > 1e-3


def test_an_uploaded_voice_speaks_as_its_clone(served):
    url, folder = served
    wav = reference_wav(0.8)
    made = httpx.post(f"{url}/v1/audio/voices", json={"name": "belinda", "transcript": REF_TEXT, "audio": {
        "data": base64.b64encode(wav).decode(), "format": "wav"}}, timeout=120)
    assert made.status_code == 200, made.text
    data = _client(url).audio.speech.create(model="higgs", voice="belinda", input=TEXT, response_format="pcm").content
    _near(_pcm(data), speak_offline(folder, TEXT, voice_codes(folder, wav), REF_TEXT))


def test_bad_input_is_a_400(served):
    url, _ = served
    with pytest.raises(openai.BadRequestError):
        _client(url).audio.speech.create(model="higgs", voice="alloy", input="   ")
    with pytest.raises(openai.BadRequestError):
        _client(url).audio.speech.create(model="higgs", voice="nobody-registered", input=TEXT)


def test_concurrent_requests_each_speak_as_alone(served):
    speak_concurrently_as_alone(served[0], "higgs", "alloy", lsb=2)


def test_speech_stream_websocket_speaks_each_sentence(served):
    """Text typed in pieces on the speech WebSocket: each sentence spoken as /v1/audio/speech speaks it."""
    url, _ = served
    pieces = ["hello the", "re, how are you today? I am ", "fine, thank", " you."]
    events = [{"type": "input_text.delta", "delta": p} for p in pieces] + [{"type": "input_text.done"}]
    got = asyncio.run(ws_session(url, "higgs", events))
    assert got[-1]["type"] == "speech.audio.done", got[-1]
    done = [e["text"] for e in got if e["type"] == "speech.segment.done"]
    assert len(done) == 2
    for segment, text in enumerate(done):
        data = b"".join(base64.b64decode(e["audio"]) for e in got
                        if e["type"] == "speech.audio.delta" and e["segment"] == segment)
        whole = _client(url).audio.speech.create(model="higgs", voice="alloy", input=text,
                                                 response_format="pcm").content
        np.testing.assert_allclose(_pcm(data), _pcm(whole), atol=2 / 32767 + 1e-3)
