"""Smart Turn v3.2 (``semantic_vad``'s classifier): its features as pipecat prepares them, its decisions on real
(espeak-ng) speech, and the turn tracker's use of a judge at a pause."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import torch

from omnistage.audio.decode import resample
from omnistage.audio.smart_turn import RATE, features, last_window, load_smart_turn
from omnistage.audio.turn_judge import TurnJudge
from omnistage.audio.vad import TurnTracker, VadConfig

pytest.importorskip("onnxruntime")
needs_espeak = pytest.mark.skipif(shutil.which("espeak-ng") is None, reason="needs espeak-ng for real speech")


def spoken(text: str, tail_s: float = 0.2) -> np.ndarray:
    """``text`` in espeak-ng's voice at 16 kHz, its own silences trimmed, then ``tail_s`` of silence (the pause)."""
    from omnistage.tools.bench.realtime_speech import synthesize

    samples, source = synthesize(text)
    assert source == "espeak-ng"
    audio = resample(samples, 24000, RATE).astype(np.float32)
    loud = np.flatnonzero(np.abs(audio) > 1e-3)
    return np.concatenate([audio[loud[0]:loud[-1] + 1], np.zeros(int(tail_s * RATE), np.float32)])


def test_features_are_pipecats_whisper_features() -> None:
    """The log-mel the model gets is the one pipecat's analyzer computes (its vendored copy of transformers'
    WhisperFeatureExtractor): float32 rounding apart (the waveform is normalised in float32 first)."""
    whisper = pytest.importorskip("pipecat.audio.turn.smart_turn._whisper_features")
    rng = np.random.default_rng(0)
    t = np.arange(3 * RATE) / RATE
    audio = (0.3 * np.sin(2 * np.pi * 220 * t) * (np.sin(2 * np.pi * 3 * t) > 0)
             + 0.01 * rng.standard_normal(len(t))).astype(np.float32)
    window = last_window(audio)
    assert window.shape == (8 * RATE,) and not window[:5 * RATE].any()  # shorter audio: zeros in front
    ours = features(window)
    assert ours.shape == (80, 800)
    torch.testing.assert_close(torch.from_numpy(ours), torch.from_numpy(whisper.compute_whisper_log_mel_features(window)),
                               atol=1e-4, rtol=0)


@needs_espeak
def test_a_finished_question_is_complete_a_cut_phrase_is_not() -> None:
    model = load_smart_turn()
    done = model.probability(spoken("What is the weather like tomorrow?"))
    cut = model.probability(spoken("I would like to know what the"))
    assert done > 0.5 > cut, (done, cut)


def scores(*runs: tuple[float, int]) -> list[float]:
    return [score for score, n in runs for _ in range(n)]


def test_a_pause_judged_complete_stops_the_turn_there() -> None:
    """20 ms frames: speech starts after 60 ms, a pause is asked about after 200 ms, silence ends a turn after 2 s."""
    asked: list[tuple[int, int]] = []
    tracker = TurnTracker(VadConfig(silence_duration_ms=2000, pause_ms=200), 20)
    edges = tracker.update(scores((0.0, 5), (1.0, 30), (0.0, 12)), 0.5, 0.5,
                           judge=lambda start, end: asked.append((start, end)) is None)
    assert asked == [(5, 45)]  # speech from frame 5; 10 silent frames heard at frame 45
    assert edges == [("speech_started", 5), ("speech_stopped", 35)]  # where the silence began
    assert not tracker.in_speech
    assert tracker.update(scores((1.0, 3)), 0.5, 0.5) == [("speech_started", 47)]  # a new turn


def test_a_pause_judged_incomplete_waits_for_voice_or_the_whole_silence() -> None:
    tracker = TurnTracker(VadConfig(silence_duration_ms=2000, pause_ms=200), 20)
    never = lambda start, end: False  # noqa: E731
    edges = tracker.update(scores((1.0, 10), (0.0, 15), (1.0, 10), (0.0, 100)), 0.5, 0.5, judge=never)
    assert edges == [("speech_started", 0), ("speech_paused", 20), ("speech_resumed", 25), ("speech_paused", 45),
                     ("speech_stopped", 35)]


@needs_espeak
def test_the_judge_hears_the_turn_from_before_its_start() -> None:
    """The judge keeps what it was handed since its reset and asks about the turn from 500 ms before its start:
    at 24 kHz in 20 ms frames (resampled for the model) as at 16 kHz, the same decision."""
    model = load_smart_turn()
    audio = np.concatenate([np.zeros(RATE, np.float32), spoken("What is the weather like tomorrow?")])
    frame = RATE * 20 // 1000
    judge = TurnJudge(model, RATE, frame)
    judge.heard(audio[: len(audio) // frame * frame])
    assert judge(RATE // frame, len(audio) // frame)
    assert judge.last == pytest.approx(model.probability(audio[RATE // 2: len(audio) // frame * frame]), abs=1e-6)
    high = resample(audio, RATE, 24000).astype(np.float32)
    judge24 = TurnJudge(model, 24000, 480)
    judge24.heard(high[: len(high) // 480 * 480])
    assert judge24(50, len(high) // 480)


def test_an_incomplete_pause_is_asked_again_as_its_silence_doubles() -> None:
    """20 ms frames, a 100 ms pause (5 frames): asked at 5, 10, 20, 40 silent frames (not every frame); the third
    verdict is "complete", and the turn stops where its silence began."""
    asked: list[int] = []

    def judge(start: int, end: int) -> bool:
        asked.append(end - 20)  # silent frames heard so far
        return len(asked) == 3

    tracker = TurnTracker(VadConfig(silence_duration_ms=2000, pause_ms=100), 20)
    edges = tracker.update(scores((1.0, 20), (0.0, 30)), 0.5, 0.5, judge=judge)
    assert asked == [5, 10, 20]
    assert edges == [("speech_started", 0), ("speech_paused", 25), ("speech_stopped", 20)]
    # Without a judge (server_vad's speculative pause) a pause is reported once, never asked again.
    plain = TurnTracker(VadConfig(silence_duration_ms=2000, pause_ms=100), 20)
    assert plain.update(scores((1.0, 20), (0.0, 40)), 0.5, 0.5) == [("speech_started", 0), ("speech_paused", 25)]
    # Voice back after a pause: the next pause is asked afresh from its own first 100 ms.
    asked.clear()
    again = TurnTracker(VadConfig(silence_duration_ms=2000, pause_ms=100), 20)
    again.update(scores((1.0, 20), (0.0, 12), (1.0, 5), (0.0, 5)), 0.5, 0.5, judge=lambda s, e: asked.append(e) is None
                 and False)
    assert asked == [25, 30, 42]
