"""/v1/audio/speech through the official client: whole files, streamed bytes and SSE events."""

from __future__ import annotations

import base64
import io
import json

import numpy as np
import pytest
import soundfile as sf

from omnistage.core import Modality
from tests.audio.signals import av_decode, peak_hz
from tests.entrypoints.conftest import LiveServer
from tests.entrypoints.fake_engine import WORDS

SPEECH = {"model": "fake-omni", "voice": "chelsie", "input": "Hello from the fake engine."}


def _decode(data: bytes, fmt: str) -> tuple[np.ndarray, int]:
    if fmt == "pcm":
        return np.frombuffer(data, "<i2").astype(np.float32) / 32767, 24000
    if fmt == "wav":
        samples, rate = sf.read(io.BytesIO(data), dtype="float32")
        return samples, rate
    return av_decode(data)


@pytest.mark.parametrize("fmt", ["wav", "mp3", "flac", "opus", "aac", "pcm"])
def test_speech_formats(server: LiveServer, fmt: str) -> None:
    response = server.client().audio.speech.create(**SPEECH, response_format=fmt)
    samples, rate = _decode(response.content, fmt)
    assert len(samples) >= 0.9 * len(WORDS) * 0.1 * rate
    assert abs(peak_hz(samples, rate) - 440) < 5
    request = server.engine.requests[-1]
    assert request.voice == "Chelsie"
    assert request.modalities == frozenset({Modality.TEXT, Modality.AUDIO})


def test_streamed_flac_reads_whole_with_soundfile(server: LiveServer) -> None:
    """The streamed FLAC's header has the exact length libsndfile needs; FLAC is lossless on the PCM16 samples."""
    with server.client().audio.speech.with_streaming_response.create(**SPEECH, response_format="flac") as response:
        assert response.headers["content-type"] == "audio/flac"
        flac = b"".join(response.iter_bytes(chunk_size=1000))
    pcm = server.client().audio.speech.create(**SPEECH, response_format="pcm").content
    samples, rate = sf.read(io.BytesIO(flac), dtype="int16")
    assert rate == 24000
    np.testing.assert_array_equal(samples, np.frombuffer(pcm, "<i2"))


@pytest.mark.parametrize("speed", [0.5, 2.0, 4.0])
def test_speech_speed_stretches_time_not_pitch(server: LiveServer, speed: float) -> None:
    plain = np.frombuffer(server.client().audio.speech.create(**SPEECH, response_format="pcm").content, "<i2")
    fast = np.frombuffer(server.client().audio.speech.create(**SPEECH, response_format="pcm", speed=speed).content,
                         "<i2")
    assert len(plain) == len(WORDS) * 2400
    assert abs(len(fast) - len(plain) / speed) <= 1  # exact up to rounding
    assert abs(peak_hz(fast.astype(np.float32), 24000) - 440) < 5


def test_speech_speed_streams_as_sse(server: LiveServer) -> None:
    """Streamed chunk by chunk, the stretched audio is the whole response's (WSOLA state is carried)."""
    whole = server.client().audio.speech.create(**SPEECH, response_format="pcm", speed=1.5).content
    with server.client().audio.speech.with_streaming_response.create(
            **SPEECH, response_format="pcm", stream_format="sse", speed=1.5) as response:
        events = [json.loads(line[len("data: "):]) for line in response.iter_lines() if line.startswith("data: ")]
    deltas = [base64.b64decode(e["audio"]) for e in events if e["type"] == "speech.audio.delta"]
    assert len(deltas) >= 3 and b"".join(deltas) == whole  # same samples through the same pcm16 conversion


def test_speech_speed_one_is_the_default(server: LiveServer) -> None:
    plain = server.client().audio.speech.create(**SPEECH, response_format="pcm").content
    assert server.client().audio.speech.create(**SPEECH, response_format="pcm", speed=1.0).content == plain


def test_speech_media_type_and_default_format(server: LiveServer) -> None:
    with server.client().audio.speech.with_streaming_response.create(**SPEECH) as response:
        assert response.headers["content-type"] == "audio/mpeg"
        data = b"".join(response.iter_bytes())
    assert av_decode(data)[0].size > 0


def test_speech_prompt_carries_the_input_and_instructions(server: LiveServer, processor) -> None:  # noqa: ANN001
    server.client().audio.speech.create(**SPEECH, instructions="Whisper it.", response_format="pcm")
    request = server.engine.requests[-1]
    text = processor.tokenizer.decode(request.prompt.token_ids)
    assert "Whisper it." in text and "Hello from the fake engine." in text
    assert request.sampling.max_tokens <= 2 * len(request.prompt.token_ids) + 16


def test_speech_sse(server: LiveServer) -> None:
    with server.client().audio.speech.with_streaming_response.create(
            **SPEECH, response_format="pcm", stream_format="sse") as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        events = [json.loads(line[len("data: "):]) for line in response.iter_lines() if line.startswith("data: ")]
    deltas = [e for e in events if e["type"] == "speech.audio.delta"]
    assert len(deltas) == len(WORDS)
    pcm = b"".join(base64.b64decode(e["audio"]) for e in deltas)
    assert len(pcm) == 2 * len(WORDS) * 2400
    assert events[-1]["type"] == "speech.audio.done"
    assert events[-1]["usage"]["output_tokens"] == len(WORDS)


def test_speech_sse_reports_engine_failure(server: LiveServer) -> None:
    server.engine.fail_with = "code2wav crashed"
    with server.client().audio.speech.with_streaming_response.create(
            **SPEECH, response_format="wav", stream_format="sse") as response:
        events = [json.loads(line[len("data: "):]) for line in response.iter_lines() if line.startswith("data: ")]
    assert "code2wav crashed" in events[-1]["error"]["message"]


def test_speech_failing_before_any_audio_is_a_json_error(server: LiveServer) -> None:
    import openai

    server.engine.words = ("x",)  # the only output is the failed final one
    server.engine.fail_with = "talker out of memory"
    with pytest.raises(openai.InternalServerError) as info:
        server.client().audio.speech.create(**SPEECH, response_format="wav")
    assert "talker out of memory" in info.value.body["message"]
    assert info.value.body["type"] == "server_error"
