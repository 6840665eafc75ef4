"""Word timestamps from the forced aligner served beside the recogniser (``serve ASR_DIR --aligner ALIGNER_DIR``):
the OpenAI SDK's ``verbose_json`` with ``timestamp_granularities=["word"]`` (and segments beside them) carries each
word of the transcript, as the aligner splits it, timed within the audio; without an aligner a word request is
still refused; a checkpoint that is no aligner is refused as one."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import openai
import pytest
import soundfile as sf

from omnistage.families.qwen3_asr.aligner import ForcedAligner, split_words
from omnistage.pipeline.engine import load_word_timer
from tests.entrypoints.speech_sample import speech

pytestmark = pytest.mark.e2e
RATE = 16000


@pytest.fixture(scope="module")
def spoken_wav() -> tuple[np.ndarray, bytes]:
    samples, _ = speech("Hello world, this is a test.", RATE)
    out = io.BytesIO()
    sf.write(out, samples, RATE, format="WAV", subtype="PCM_16")
    return samples, out.getvalue()


def _client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0, timeout=120)


def test_verbose_json_words_are_the_aligners(aligned_url: str, aligner_dir: Path,
                                             spoken_wav: tuple[np.ndarray, bytes]) -> None:
    samples, wav = spoken_wav
    reply = _client(aligned_url).audio.transcriptions.create(
        model="asr", file=("a.wav", wav), language="en", response_format="verbose_json",
        timestamp_granularities=["word", "segment"])
    assert reply.text and [w.word for w in reply.words] == split_words(reply.text)
    # The served words are the aligner's own on the same audio and text (the file is one piece: no offset).
    ours = ForcedAligner(aligner_dir).align(samples, reply.text, "en")
    served = [x for w in reply.words for x in (w.start, w.end)]
    assert served == pytest.approx([x for t in ours for x in (t.start, t.end)], abs=5e-4)  # served rounded to 1 ms
    assert all(0.0 <= w.start <= w.end <= reply.duration for w in reply.words)
    assert len(reply.segments) == 1


def test_words_alone_leave_segments_out(aligned_url: str, spoken_wav: tuple[np.ndarray, bytes]) -> None:
    reply = _client(aligned_url).audio.transcriptions.create(
        model="asr", file=("a.wav", spoken_wav[1]), language="en", response_format="verbose_json",
        timestamp_granularities=["word"])
    assert reply.words and not getattr(reply, "segments", None)


def test_without_an_aligner_words_are_refused(asr_url: str, spoken_wav: tuple[np.ndarray, bytes]) -> None:
    with pytest.raises(openai.BadRequestError, match="--aligner"):
        _client(asr_url).audio.transcriptions.create(model="asr", file=("a.wav", spoken_wav[1]),
                                                     response_format="verbose_json", timestamp_granularities=["word"])


def test_a_recogniser_is_no_aligner(asr_dir: Path) -> None:
    with pytest.raises(ValueError, match="no forced aligner"):
        load_word_timer(asr_dir)
