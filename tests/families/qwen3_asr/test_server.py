"""Qwen3-ASR on ``/v1/audio/transcriptions`` through the OpenAI SDK against a live server on the tiny recogniser's
real pipeline: espeak-ng speech (a voiced stand-in without it) in every response format and streamed, the language
forced through the model's own prompt, the caller's prompt as context, several requests batched at once, a file
longer than a segment; and the refusals (translation, an unknown language, empty or corrupt audio) as OpenAI's
400s. The tiny's weights are random, so the text is checked against the engine's own greedy reply, not English."""

from __future__ import annotations

import io
import json
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
import openai
import pytest
import soundfile as sf

from omnistage.families.qwen3_asr.model import Qwen3ASR
from omnistage.families.qwen3_asr.prompt import Qwen3ASRPromptProcessor
from omnistage.families.qwen3_asr.transcriber import ASRReply
from omnistage.families.qwen3_asr.verify import greedy_tokens
from tests.entrypoints.speech_sample import speech

pytestmark = pytest.mark.e2e
RATE = 16000


def _wav(samples: np.ndarray) -> bytes:
    out = io.BytesIO()
    sf.write(out, samples, RATE, format="WAV", subtype="PCM_16")
    return out.getvalue()


@pytest.fixture(scope="module")
def spoken() -> np.ndarray:
    samples, _ = speech("Hello world, this is a test.", RATE)
    return samples


@pytest.fixture(scope="module")
def client(asr_url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{asr_url}/v1", api_key="none", max_retries=0, timeout=120)


def _expected(asr_dir: Path, audio: np.ndarray, language: str | None = None, context: str | None = None) -> str:
    """The recogniser's own greedy reply to the same prompt, read as the server reads it."""
    model = Qwen3ASR.from_checkpoint(asr_dir)
    processor = Qwen3ASRPromptProcessor(asr_dir, 50)
    # The served budget: 16 + 8 tokens a second of audio.
    tokens = greedy_tokens(model, processor.prompt(audio, language, context), int(16 + 8 * len(audio) / RATE))
    text = processor.tokenizer.decode(tokens, skip_special_tokens=True)
    return text.strip() if language else ASRReply().feed(text).strip() if "<asr_text>" in text else ""


def test_json_is_the_recognisers_reply(client: openai.OpenAI, spoken: np.ndarray, asr_dir: Path) -> None:
    reply = client.audio.transcriptions.create(model="asr", file=("a.wav", _wav(spoken)), language="en")
    assert reply.text and reply.text == _expected(asr_dir, spoken, "English")


def test_the_prompt_is_context_and_changes_the_reply(client: openai.OpenAI, spoken: np.ndarray, asr_dir: Path) -> None:
    reply = client.audio.transcriptions.create(model="asr", file=("a.wav", _wav(spoken)), language="en",
                                               prompt="The quick brown fox.")
    assert reply.text == _expected(asr_dir, spoken, "en", "The quick brown fox.")


@pytest.mark.parametrize("fmt", ["text", "srt", "vtt", "verbose_json"])
def test_every_response_format(client: openai.OpenAI, spoken: np.ndarray, fmt: str) -> None:
    plain = client.audio.transcriptions.create(model="asr", file=("a.wav", _wav(spoken)), language="en").text
    reply = client.audio.transcriptions.create(model="asr", file=("a.wav", _wav(spoken)), language="en",
                                               response_format=fmt)
    if fmt == "verbose_json":
        assert reply.text == plain and reply.language == "en" and reply.segments[0].end == pytest.approx(
            len(spoken) / RATE, abs=1e-3)
    else:
        assert plain in str(reply)


def test_stream_deltas_join_to_the_whole_reply(client: openai.OpenAI, spoken: np.ndarray) -> None:
    whole = client.audio.transcriptions.create(model="asr", file=("a.wav", _wav(spoken)), language="fr").text
    events = list(client.audio.transcriptions.create(model="asr", file=("a.wav", _wav(spoken)), language="fr",
                                                     stream=True))
    deltas = [e.delta for e in events if e.type == "transcript.text.delta"]
    assert events[-1].type == "transcript.text.done" and events[-1].text == whole == "".join(deltas)


def test_unforced_reply_hides_the_language_markup(client: openai.OpenAI, spoken: np.ndarray) -> None:
    reply = client.audio.transcriptions.create(model="asr", file=("a.wav", _wav(spoken)))
    assert "<asr_text>" not in reply.text and "language " not in reply.text[:9]


def test_concurrent_requests_are_batched_and_each_gets_its_own(client: openai.OpenAI, spoken: np.ndarray,
                                                               asr_url: str) -> None:
    # Long enough (a reply budget of ~100 tokens) that six requests overlap in the engine whatever the machine.
    long = np.concatenate([spoken] * 4)
    clips = [long, long[: len(long) // 2], long[::-1].copy()]
    alone = [client.audio.transcriptions.create(model="asr", file=("a.wav", _wav(c)), language="en").text
             for c in clips]
    peak = _RunningPeak(asr_url)
    with ThreadPoolExecutor(6) as pool:
        peak.start()
        together = list(pool.map(lambda c: client.audio.transcriptions.create(
            model="asr", file=("a.wav", _wav(c)), language="en").text, clips * 2))
    assert together == alone * 2
    assert peak.stop() >= 2  # the stage ran several of them in one batch


class _RunningPeak(threading.Thread):
    """The most requests the recogniser stage had scheduled at once, polled from ``/metrics``."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self.url, self.peak, self.done = url, 0.0, threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            for line in httpx.get(f"{self.url}/metrics", timeout=10).text.splitlines():
                if line.startswith("omnistage_requests_running{"):
                    self.peak = max(self.peak, float(line.rsplit(" ", 1)[1]))
            self.done.wait(0.01)

    def stop(self) -> float:
        self.done.set()
        self.join()
        return self.peak


def test_audio_longer_than_the_encoder_window_is_one_prompt(client: openai.OpenAI, spoken: np.ndarray,
                                                             asr_dir: Path) -> None:
    """35 s spans nine of the tiny encoder's 4 s attention windows, and more than the thinker's 30 s segments: Qwen3-ASR
    reads it in one prompt as qwen-asr does (it cuts only past 20 minutes)."""
    long = np.concatenate([spoken] * (int(35 * RATE / len(spoken)) + 1))
    reply = client.audio.transcriptions.create(model="asr", file=("a.wav", _wav(long)), language="en",
                                               response_format="verbose_json")
    assert len(reply.segments) == 1 and reply.segments[0].end == pytest.approx(len(long) / RATE, abs=1e-3)
    assert reply.text == _expected(asr_dir, long, "en")


def test_a_file_past_the_recognisers_piece_is_cut_at_a_quiet_moment() -> None:
    from omnistage.entrypoints.openai.transcription.segments import split
    from omnistage.families.qwen3_asr.transcriber import ASRTranscriber

    rng = np.random.default_rng(0)
    audio = (0.1 * rng.standard_normal(int(2500 * 100))).astype(np.float32)  # 2500 s at a 100 Hz stand-in rate
    audio[1197 * 100:1198 * 100] = 0.0  # within the last 5 s of the first piece, where its cut is sought
    pieces = split(audio, 100, ASRTranscriber.segment_seconds)
    assert len(pieces) == 3 and 1197 <= pieces[0].end / 100 <= 1198


@pytest.mark.parametrize(("route", "data", "file", "code"), [
    ("translations", {}, None, "translation_not_supported"),
    ("transcriptions", {"language": "xx"}, None, "unsupported_language"),
    ("transcriptions", {}, b"", None),
    ("transcriptions", {}, b"RIFF\x00\x00\x00\x00WAVEjunkjunk", None),
])
def test_refusals_are_openai_shaped_400s(asr_url: str, spoken: np.ndarray, route: str, data: dict[str, str],
                                         file: bytes | None, code: str | None) -> None:
    body = _wav(spoken) if file is None else file
    reply = httpx.post(f"{asr_url}/v1/audio/{route}", data={"model": "asr", **data},
                       files={"file": ("a.wav", body, "audio/wav")}, timeout=60)
    assert reply.status_code == 400, reply.text
    error = json.loads(reply.text)["error"]
    assert error["type"] == "invalid_request_error" and error["message"]
    if code is not None:
        assert error["code"] == code


@pytest.mark.parametrize(("path", "body", "needle"), [
    ("/v1/chat/completions", {"model": "asr", "messages": [{"role": "user", "content": "hi"}]}, "speech recogniser"),
    ("/v1/responses", {"model": "asr", "input": "hi"}, "speech recogniser"),
    ("/v1/audio/speech", {"model": "asr", "input": "hi", "voice": "alloy"}, "cannot speak"),
])
def test_what_a_recogniser_cannot_do_is_said_in_its_terms(asr_url: str, path: str, body: dict, needle: str) -> None:
    reply = httpx.post(f"{asr_url}{path}", json=body, timeout=60)
    assert reply.status_code == 400 and needle in reply.json()["error"]["message"], reply.text
