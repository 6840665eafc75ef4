"""A FLOAT WAV holding NaN, infinity or absurd values is refused with a 400 at the one decode point every route
shares (``audio/decode.py``), before any feature is computed: chat, responses and transcriptions gave 500s
(issue 51, row 8). Voice uploads are in test_voices_tts.py; a realtime session takes PCM16 and G.711 only,
which hold no such values."""

from __future__ import annotations

import io

import httpx
import numpy as np
import pytest
import soundfile as sf

from omnistage.audio import AudioDecodeError, decode_audio
from tests.entrypoints.conftest import LiveServer
from tests.entrypoints.media_samples import b64

BAD = {"nan": np.nan, "inf": np.inf, "-inf": -np.inf, "1e30": 1e30}


def float_wav(bad: float, seconds: float = 1.0, rate: int = 16000, fmt: str = "WAV") -> bytes:
    """A FLOAT file of a quiet tone with one bad sample near its end."""
    samples = (0.1 * np.sin(np.arange(int(seconds * rate)) / 10)).astype(np.float32)
    samples[-100] = bad
    out = io.BytesIO()
    sf.write(out, samples, rate, format=fmt, subtype="FLOAT" if fmt == "WAV" else "PCM_16")
    return out.getvalue()


def _refused(reply: httpx.Response) -> None:
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert error["code"] == "invalid_audio" and ("non-finite" in error["message"] or "magnitude" in error["message"])


@pytest.mark.parametrize("bad", BAD)
def test_decode_refuses_bad_samples(bad: str) -> None:
    with pytest.raises(AudioDecodeError, match="non-finite|magnitude"):
        decode_audio(float_wav(BAD[bad]), "wav")
    with pytest.raises(AudioDecodeError, match="non-finite|magnitude"):
        decode_audio(float_wav(BAD[bad]), None)  # libsndfile first, FFmpeg never asked again


def test_decode_keeps_loud_but_real_audio() -> None:
    decoded = decode_audio(float_wav(40_000.0), "wav")  # integer-scaled floats are audio
    assert np.isfinite(decoded.samples).all()


@pytest.mark.parametrize("bad", BAD)
def test_chat_refuses_bad_samples(server: LiveServer, bad: str) -> None:
    part = {"type": "input_audio", "input_audio": {"data": b64(float_wav(BAD[bad])), "format": "wav"}}
    _refused(httpx.post(f"{server.base_url}/v1/chat/completions", timeout=30, json={
        "model": "fake-omni", "messages": [{"role": "user", "content": [part]}]}))
    assert not server.engine.requests


def test_chat_refuses_bad_samples_in_an_audio_url(server: LiveServer) -> None:
    url = "data:audio/wav;base64," + b64(float_wav(np.nan))
    _refused(httpx.post(f"{server.base_url}/v1/chat/completions", timeout=30, json={
        "model": "fake-omni", "messages": [{"role": "user", "content": [
            {"type": "audio_url", "audio_url": {"url": url}}]}]}))


def test_responses_refuses_bad_samples(server: LiveServer) -> None:
    part = {"type": "input_audio", "input_audio": {"data": b64(float_wav(np.nan)), "format": "wav"}}
    _refused(httpx.post(f"{server.base_url}/v1/responses", timeout=30, json={
        "model": "fake-omni", "input": [{"role": "user", "content": [part]}]}))
    assert not server.engine.requests


@pytest.mark.parametrize("bad", ["nan", "inf"])
def test_transcription_refuses_bad_samples(server: LiveServer, bad: str) -> None:
    _refused(httpx.post(f"{server.base_url}/v1/audio/transcriptions", data={"model": "fake-omni"}, timeout=30,
                        files={"file": ("a.wav", float_wav(BAD[bad]), "audio/wav")}))
    assert not server.engine.requests
