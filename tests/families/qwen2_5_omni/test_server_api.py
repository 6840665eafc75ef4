"""The rest of the OpenAI API on a Qwen2.5-Omni checkpoint (tiny, real pipeline in process, one server for the
session: ``conftest.base_url``): a chat with a video (alone, and with its sound track) answers text and audio;
speech streams PCM at OpenAI's rate; transcription (whole or streamed) and translation write real speech down
through the thinker.
Every check reads the content (text, samples, rates, event order), not only the status."""

from __future__ import annotations

import base64
import io
import json
import wave

import httpx
import numpy as np
import pytest

from omnistage.families.qwen2_5_omni.voices import SYSTEM_PROMPT
from omnistage.models.qwen2_5_omni.token2wav import SAMPLES_PER_CODE
from tests.entrypoints.media_samples import data_url, mp4_bytes
from tests.entrypoints.speech_sample import speech
from tests.families.qwen2_5_omni.specs import TALKER_TOKENS

pytestmark = pytest.mark.e2e
RATE = 24000  # OpenAI's PCM rate, and the family's


def _chat(base_url: str, content: list[dict], **extra: object) -> dict:
    body = {"model": "omni25", "modalities": ["text", "audio"], "audio": {"voice": "Ethan", "format": "wav"},
            "messages": [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": content}],
            "max_tokens": 6, "seed": 3, **extra}
    reply = httpx.post(f"{base_url}/v1/chat/completions", json=body, timeout=120)
    assert reply.status_code == 200, reply.text
    return reply.json()


def _wav_frames(b64: str) -> int:
    with wave.open(io.BytesIO(base64.b64decode(b64))) as wav:
        assert wav.getframerate() == RATE and wav.getnchannels() == 1 and wav.getsampwidth() == 2
        return wav.getnframes()


def test_chat_with_a_video_answers_text_and_audio(base_url: str) -> None:
    video = {"type": "video_url", "video_url": {"url": data_url("video/mp4", mp4_bytes(seconds=2.0))}}
    text_only = _chat(base_url, [{"type": "text", "text": "What happens?"}])
    answer = _chat(base_url, [video, {"type": "text", "text": "What happens?"}])
    message = answer["choices"][0]["message"]
    assert message["content"]
    assert 0 < _wav_frames(message["audio"]["data"]) <= TALKER_TOKENS * SAMPLES_PER_CODE
    # The video is in the prompt: 4 frames (2 fps) of 64 px are 2 temporal patches of 4 x 4, merged 2 x 2 into 8
    # tokens, between the vision start and end markers.
    assert answer["usage"]["prompt_tokens"] == text_only["usage"]["prompt_tokens"] + 8 + 2


def test_chat_with_a_videos_sound_track(base_url: str) -> None:
    """``use_audio_in_video``: the track (AAC) is decoded and interleaved with the frames in the prompt."""
    clip = {"type": "video_url", "video_url": {"url": data_url("video/mp4", mp4_bytes(seconds=2.0, tone_hz=440))}}
    silent = _chat(base_url, [clip, {"type": "text", "text": "Describe it."}])
    answer = _chat(base_url, [clip, {"type": "text", "text": "Describe it."}],
                   mm_processor_kwargs={"use_audio_in_video": True})
    message = answer["choices"][0]["message"]
    assert message["content"] and _wav_frames(message["audio"]["data"]) > 0
    # 2 s of sound track, 25 tokens a second (the AAC track decodes a little past 2 s: its encoder's priming),
    # join the video's between the audio start and end markers.
    assert 50 + 2 <= answer["usage"]["prompt_tokens"] - silent["usage"]["prompt_tokens"] <= 52 + 2


def test_speech_streams_pcm_at_openais_rate(base_url: str) -> None:
    body = {"model": "omni25", "input": "Good morning", "voice": "Chelsie", "response_format": "pcm",
            "stream_format": "sse"}
    events: list[dict] = []
    with httpx.stream("POST", f"{base_url}/v1/audio/speech", json=body, timeout=120) as reply:
        assert reply.status_code == 200
        events = [json.loads(line[6:]) for line in reply.iter_lines() if line.startswith("data: ")]
    kinds = [e["type"] for e in events]
    assert kinds[-1] == "speech.audio.done" and set(kinds[:-1]) == {"speech.audio.delta"}, kinds
    pcm = b"".join(base64.b64decode(e["audio"]) for e in events[:-1])
    samples = np.frombuffer(pcm, "<i2")
    assert 0 < len(samples) <= TALKER_TOKENS * SAMPLES_PER_CODE and np.abs(samples).max() > 0
    assert events[-1]["usage"]["output_tokens"] > 0


@pytest.fixture(scope="module")
def spoken_wav() -> bytes:
    """A real spoken sentence (espeak-ng), 16 kHz 16-bit WAV."""
    samples, _ = speech("Hello world, this is a test.", 16000)
    out = io.BytesIO()
    with wave.open(out, "wb") as w:
        w.setnchannels(1), w.setsampwidth(2), w.setframerate(16000)
        w.writeframes((np.clip(samples, -1, 1) * 32767).astype("<i2").tobytes())
    return out.getvalue()


@pytest.mark.parametrize("route", ["transcriptions", "translations"])
def test_speech_is_written_down_by_the_thinker(base_url: str, spoken_wav: bytes, route: str) -> None:
    files = {"file": ("hello.wav", spoken_wav, "audio/wav")}
    reply = httpx.post(f"{base_url}/v1/audio/{route}", data={"model": "omni25", "response_format": "verbose_json"},
                       files=files, timeout=120)
    assert reply.status_code == 200, reply.text
    body = reply.json()
    assert body["text"].strip() and body["duration"] == pytest.approx(len(spoken_wav) / 32000, abs=0.05)
    assert [s["text"] for s in body["segments"]] and body["segments"][0]["start"] == 0.0


def test_a_transcription_streams_its_text(base_url: str, spoken_wav: bytes) -> None:
    files = {"file": ("hello.wav", spoken_wav, "audio/wav")}
    with httpx.stream("POST", f"{base_url}/v1/audio/transcriptions", data={"model": "omni25", "stream": "true"},
                      files=files, timeout=120) as reply:
        assert reply.status_code == 200
        events = [json.loads(line[6:]) for line in reply.iter_lines()
                  if line.startswith("data: ") and line != "data: [DONE]"]
    kinds = [e["type"] for e in events]
    assert kinds[-1] == "transcript.text.done" and set(kinds[:-1]) == {"transcript.text.delta"}, kinds
    assert events[-1]["text"].strip() and events[-1]["text"] == "".join(e["delta"] for e in events[:-1])
