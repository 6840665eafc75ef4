"""Energy-based voice activity detection for the realtime endpoint's ``server_vad`` turn detection.

Audio is cut into 20 ms frames; a frame is *voiced* when its RMS level is above
``threshold_dbfs`` (dB relative to full scale: a full-scale sine is -3 dBFS,
normal speech at a headset mic sits around -30..-15 dBFS, a quiet room -60 dBFS
or lower). OpenAI's ``threshold`` (0..1, default 0.5) maps linearly onto
-60..-20 dBFS, so the default is **-40 dBFS**. Speech *starts* after
``min_speech_ms`` of consecutive voiced frames and *stops* after
``silence_duration_ms`` of consecutive unvoiced ones. No model, no state beyond
a few counters: cheap enough to run on every appended chunk in the event loop.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

FRAME_MS = 20
MIN_DBFS, MAX_DBFS = -60.0, -20.0


def threshold_to_dbfs(threshold: float) -> float:
    """OpenAI's 0..1 ``threshold`` as a level: 0 → -60 dBFS (most sensitive), 1 → -20 dBFS."""
    if not 0.0 <= threshold <= 1.0:
        raise ValueError("threshold must be in [0, 1]")
    return MIN_DBFS + (MAX_DBFS - MIN_DBFS) * threshold


@dataclass(frozen=True)
class VadConfig:
    threshold: float = 0.5  # OpenAI's scale; see threshold_to_dbfs
    silence_duration_ms: int = 500  # unvoiced time that ends a turn (OpenAI's default)
    prefix_padding_ms: int = 300  # audio kept before the detected start (OpenAI's default)
    min_speech_ms: int = 60  # voiced time that starts a turn (ignores clicks)

    def __post_init__(self) -> None:
        threshold_to_dbfs(self.threshold)
        for name in ("silence_duration_ms", "prefix_padding_ms", "min_speech_ms"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0")

    @property
    def threshold_dbfs(self) -> float:
        return threshold_to_dbfs(self.threshold)


@dataclass(frozen=True)
class VadEvent:
    kind: str  # "speech_started" or "speech_stopped"
    sample: int  # position in the stream (samples at the detector's rate) where it happened


def frame_dbfs(frames: np.ndarray) -> np.ndarray:
    """RMS level of each row of ``frames`` (float samples in [-1, 1]) in dBFS; silence is -inf-safe."""
    rms = np.sqrt(np.mean(np.square(frames, dtype=np.float64), axis=-1))
    return 20.0 * np.log10(np.maximum(rms, 1e-10))


class EnergyVad:
    """Streams samples in any piece sizes; yields start/stop events at frame resolution."""

    def __init__(self, config: VadConfig, sample_rate: int) -> None:
        self.config = config
        self.rate = sample_rate
        self.frame = sample_rate * FRAME_MS // 1000
        self._pending = np.zeros(0, dtype=np.float32)
        self._consumed = 0  # samples already framed
        self.in_speech = False
        self._run = 0  # consecutive frames of the state that would flip ``in_speech``
        self._need_on = max(1, -(-config.min_speech_ms // FRAME_MS))
        self._need_off = max(1, -(-config.silence_duration_ms // FRAME_MS))

    def reset(self) -> None:
        self._pending = np.zeros(0, dtype=np.float32)
        self._consumed = 0
        self.in_speech = False
        self._run = 0

    def feed(self, samples: np.ndarray) -> list[VadEvent]:
        data = np.concatenate([self._pending, np.asarray(samples, dtype=np.float32)])
        n = len(data) // self.frame
        self._pending = data[n * self.frame:]
        if n == 0:
            return []
        voiced = frame_dbfs(data[: n * self.frame].reshape(n, self.frame)) > self.config.threshold_dbfs
        events: list[VadEvent] = []
        for i, v in enumerate(voiced):
            self._run = self._run + 1 if bool(v) != self.in_speech else 0
            if self._run >= (self._need_off if self.in_speech else self._need_on):
                end = self._consumed + (i + 1) * self.frame
                self.in_speech = not self.in_speech
                self._run = 0
                if self.in_speech:
                    events.append(VadEvent("speech_started", end - self._need_on * self.frame))
                else:
                    events.append(VadEvent("speech_stopped", end - self._need_off * self.frame))
        self._consumed += n * self.frame
        return events


def make_vad(config: VadConfig | None, sample_rate: int) -> EnergyVad | None:
    """The detector for a session's turn detection (None: turns are committed by the client)."""
    return None if config is None else EnergyVad(config, sample_rate)
