"""Audio whose header gives no length, at each entry point that decodes client audio: chat ``input_audio``,
a transcription upload, a voice's reference recording. The header check cannot bound it, so the decoder does:
a 400 naming ``--max-audio-samples`` as soon as the decoded samples (frames x channels) pass the limit; under the
limit the same file is served."""

from __future__ import annotations

import base64
from collections.abc import Iterator

import httpx
import pytest

from omnistage.entrypoints.openai.api_server import build_app
from omnistage.entrypoints.openai.common.errors import APIError
from omnistage.entrypoints.openai.server_config import MediaPolicy, ServerLimits
from omnistage.entrypoints.openai.speech.reference_audio import decode_reference
from tests.audio.signals import flac_without_length, tone
from tests.entrypoints.fake_engine import FakeEngine, RecordingProcessor, fake_front_end
from tests.entrypoints.server_thread import ServerThread

RATE, CHANNELS = 48_000, 8
LIMITS = ServerLimits(max_audio_samples=RATE * CHANNELS * 3, max_audio_seconds=600.0)  # 3 s of 8 channels
LONG = flac_without_length(tone(440, 10.0, RATE, channels=CHANNELS), RATE)  # 10 s: over, unknown until decoded
SHORT = flac_without_length(tone(440, 1.0, RATE, channels=CHANNELS), RATE)


@pytest.fixture(scope="module")
def base_url(processor: RecordingProcessor) -> Iterator[str]:
    thread = ServerThread(build_app(FakeEngine(fake_front_end(processor)), LIMITS, MediaPolicy()))
    yield thread.start()
    thread.stop()


def _chat(base_url: str, audio: bytes) -> httpx.Response:
    part = {"type": "input_audio", "input_audio": {"data": base64.b64encode(audio).decode(), "format": "flac"}}
    return httpx.post(f"{base_url}/v1/chat/completions", timeout=60, json={
        "model": "fake-omni", "max_tokens": 2, "messages": [{"role": "user", "content": [part]}]})


def _refused_for_samples(r: httpx.Response) -> bool:
    error = r.json().get("error") or {}
    return r.status_code == 400 and "--max-audio-samples" in error.get("message", "") \
        and error.get("code") == "audio_too_large"


def test_chat_audio_without_a_length_is_refused_at_the_samples_bound(base_url: str) -> None:
    r = _chat(base_url, LONG)
    assert _refused_for_samples(r), r.text
    assert _chat(base_url, SHORT).status_code == 200


def test_a_transcription_upload_without_a_length_is_refused_at_the_samples_bound(base_url: str) -> None:
    def upload(audio: bytes) -> httpx.Response:
        return httpx.post(f"{base_url}/v1/audio/transcriptions", timeout=60, data={"model": "fake-omni"},
                          files={"file": ("a.flac", audio, "audio/flac")})

    r = upload(LONG)
    assert _refused_for_samples(r) and r.json()["error"]["param"] == "file", r.text
    assert upload(SHORT).status_code == 200


def test_a_reference_recording_without_a_length_is_refused_at_the_samples_bound() -> None:
    """A voice upload's and a speech request's ref_audio decoding (both call decode_reference)."""
    limits = ServerLimits(max_audio_samples=RATE * CHANNELS * 3, max_voice_seconds=60.0)
    with pytest.raises(APIError) as refused:
        decode_reference(LONG, "flac", limits, "audio.data")
    assert refused.value.status_code == 400 and "--max-audio-samples" in refused.value.detail.message
    assert refused.value.detail.param == "audio.data"
    short = decode_reference(SHORT, "flac", limits, "audio.data")
    assert short.sample_rate == RATE and short.samples.size == RATE
