"""Voice activity detection for the realtime endpoint's ``server_vad`` turn detection: the shared parts and
the energy detector.

A detector scores fixed frames of the stream; ``TurnTracker`` turns the scores
into turns the same way for every detector: speech *starts* after
``min_speech_ms`` of consecutive frames scoring at or above the start level and
*stops* after ``silence_duration_ms`` of consecutive frames below the stop level
(a lower stop level than start level is hysteresis: a turn is not cut by one
soft syllable). With ``pause_ms`` set (shorter than the silence), a turn in progress
also reports a *pause* once that much silence has passed, at the sample heard so
far, and a *resume* when voice returns before the turn stops: the realtime session
starts a speculative reply at the pause (``realtime/speculation.py``). With a *judge*
(``semantic_vad``: ``turn_judge.py`` asks the Smart Turn classifier) the turn's silence
is put to it after ``judge_ms`` (default: at the pause): a turn it calls complete stops
there and then (reported where its silence began), one it calls incomplete is asked
again each time its silence has doubled (2x, 4x, 8x...), and goes on until voice
returns, a later verdict says complete, or the whole silence has passed. Two detectors (``vad_backend.py`` chooses, ``--vad``):

* Silero VAD (``silero.py``, the default): a speech probability per 32 ms;
  OpenAI's ``threshold`` (0..1, default 0.5) is that probability, as in
  Silero's own iterator, and a turn ends below ``threshold - 0.15``.
* ``EnergyVad`` here, the fallback: 20 ms frames, *voiced* when their RMS level
  is above ``threshold_dbfs`` (dB relative to full scale: a full-scale sine is
  -3 dBFS, normal speech at a headset mic sits around -30..-15 dBFS, a quiet room
  -60 dBFS or lower). ``threshold`` maps linearly onto -60..-20 dBFS, so the
  default is **-40 dBFS**. Loud noise is speech to it. No model, a few
  counters: cheap enough to run on every appended chunk in the event loop.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from math import ceil
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from omnistage.audio.turn_judge import TurnJudge

FRAME_MS = 20
MIN_DBFS, MAX_DBFS = -60.0, -20.0
# Asked at a pause whether the turn is over: its frames [start, end) counted from the detector's reset (the speech
# start to what has been heard, the pause's silence included).
Judge = Callable[[int, int], bool]


def threshold_to_dbfs(threshold: float) -> float:
    """OpenAI's 0..1 ``threshold`` as a level: 0 → -60 dBFS (most sensitive), 1 → -20 dBFS."""
    if not 0.0 <= threshold <= 1.0:
        raise ValueError("threshold must be in [0, 1]")
    return MIN_DBFS + (MAX_DBFS - MIN_DBFS) * threshold


@dataclass(frozen=True)
class VadConfig:
    threshold: float = 0.5  # OpenAI's 0..1: Silero's speech probability, or a level (threshold_to_dbfs)
    silence_duration_ms: int = 500  # unvoiced time that ends a turn (OpenAI's default)
    prefix_padding_ms: int = 300  # audio kept before the detected start (OpenAI's default)
    min_speech_ms: int = 60  # voiced time that starts a turn (ignores clicks)
    pause_ms: int = 0  # omnistage's: unvoiced time in a turn reported as a pause (0, or >= the silence: never)
    judge_ms: int = 0  # semantic_vad: unvoiced time after which a judge is first asked (0: at the pause)

    def __post_init__(self) -> None:
        threshold_to_dbfs(self.threshold)
        for name in ("silence_duration_ms", "prefix_padding_ms", "min_speech_ms", "pause_ms", "judge_ms"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0")

    @property
    def threshold_dbfs(self) -> float:
        return threshold_to_dbfs(self.threshold)


@dataclass(frozen=True)
class VadEvent:
    kind: str  # "speech_started", "speech_stopped", "speech_paused" or "speech_resumed"
    sample: int  # position in the stream (samples at the detector's rate) where it happened (a pause: the end of
    # what was heard when it was reported)


class TurnTracker:
    """Frame scores in, speech start/stop (and pause/resume) out (as frame indices counted from the last reset)."""

    def __init__(self, config: VadConfig, frame_ms: float) -> None:
        self._need_on = max(1, ceil(config.min_speech_ms / frame_ms))
        self._need_off = max(1, ceil(config.silence_duration_ms / frame_ms))
        pause = ceil(config.pause_ms / frame_ms) if config.pause_ms > 0 else 0
        self._need_pause = pause if 0 < pause < self._need_off else 0  # 0: no pauses reported
        judged = ceil(config.judge_ms / frame_ms) if config.judge_ms > 0 else self._need_pause
        self._need_judge = judged if 0 < judged < self._need_off else 0  # 0: a judge is never asked
        self.reset()

    def reset(self) -> None:
        self.in_speech = False
        self.paused = False  # a pause was reported in the turn in progress, and no voice came back since
        self._run = 0  # consecutive frames of the state that would flip ``in_speech``
        self._frames = 0
        self._start = 0  # the frame where the turn in progress started

    def update(self, scores: Iterable[float], start_at: float, stop_below: float,
               judge: Judge | None = None) -> list[tuple[str, int]]:
        """``(kind, frame)`` for each turn edge: ``frame`` is the first frame of the run that flipped it (a resume: the
        voiced frame; a pause: the frame after the last one heard, so the audio before it is what was heard).
        With ``judge``, a silence it calls the turn's end is a stop (at the silence's first frame)."""
        edges: list[tuple[str, int]] = []
        for score in scores:
            voiced = score >= (stop_below if self.in_speech else start_at)
            self._run = self._run + 1 if voiced != self.in_speech else 0
            need = self._need_off if self.in_speech else self._need_on
            self._frames += 1
            if self.paused and voiced:
                self.paused = False
                edges.append(("speech_resumed", self._frames - 1))
            if self._run >= need:
                self.in_speech, self._run, self.paused = not self.in_speech, 0, False
                edges.append(("speech_started" if self.in_speech else "speech_stopped", self._frames - need))
                self._start = self._frames - need
            elif self.in_speech and self._run:
                edges.extend(self._silent(judge))
        return edges

    def _silent(self, judge: Judge | None) -> list[tuple[str, int]]:
        """A silent frame inside a turn: the judge asked when it is time (a "complete" stops the turn where its
        silence began), and the pause reported once (at ``pause_ms``; with no pause set, at the first verdict of
        "incomplete")."""
        asked = judge is not None and self._asks()
        if asked and judge(self._start, self._frames):
            silent, self.in_speech, self._run, self.paused = self._run, False, 0, False
            return [("speech_stopped", self._frames - silent)]
        if not self.paused and (self._run == self._need_pause or (asked and not self._need_pause)):
            self.paused = True
            return [("speech_paused", self._frames)]
        return []

    def _asks(self) -> bool:
        """Whether a judge is asked after this much silence (``_run`` frames): at ``judge_ms``, then each time the
        silence has doubled since (a verdict of "incomplete" at a short pause may change as the silence grows, and
        the classifier costs too much to ask every frame)."""
        if not self._need_judge or self._run % self._need_judge:
            return False
        times = self._run // self._need_judge
        return times & (times - 1) == 0


def frame_dbfs(frames: np.ndarray) -> np.ndarray:
    """RMS level of each row of ``frames`` (float samples in [-1, 1]) in dBFS; silence is -inf-safe."""
    rms = np.sqrt(np.mean(np.square(frames, dtype=np.float64), axis=-1))
    return 20.0 * np.log10(np.maximum(rms, 1e-10))


class EnergyVad:
    """Streams samples in any piece sizes; yields start/stop events at frame resolution."""

    def __init__(self, config: VadConfig, sample_rate: int, judge: TurnJudge | None = None) -> None:
        """``judge``: semantic_vad's, at ``sample_rate`` and this detector's frames (None: pauses only reported)."""
        self.config, self.judge = config, judge
        self.frame = sample_rate * FRAME_MS // 1000
        self._turns = TurnTracker(config, FRAME_MS)
        self._pending = np.zeros(0, dtype=np.float32)

    @property
    def inline(self) -> bool:
        """Cheap enough for the event loop, unless a classifier judges its pauses."""
        return self.judge is None

    @property
    def in_speech(self) -> bool:
        return self._turns.in_speech

    def reset(self) -> None:
        self._pending = np.zeros(0, dtype=np.float32)
        self._turns.reset()
        if self.judge is not None:
            self.judge.reset()

    def feed(self, samples: np.ndarray) -> list[VadEvent]:
        data = np.concatenate([self._pending, np.asarray(samples, dtype=np.float32)])
        n = len(data) // self.frame
        self._pending = data[n * self.frame:]
        if n == 0:
            return []
        if self.judge is not None:
            self.judge.heard(data[: n * self.frame])
        levels = frame_dbfs(data[: n * self.frame].reshape(n, self.frame)).tolist()
        level = self.config.threshold_dbfs
        edges = self._turns.update(levels, level, level, self.judge)
        return [VadEvent(kind, frame * self.frame) for kind, frame in edges]
