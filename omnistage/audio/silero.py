"""Silero VAD on a live stream: the ``silero-vad`` package's own TorchScript model, one state per stream.

The package ships ``silero_vad.jit``; its 16 kHz network (``_model``) maps 64
samples of context plus a 512-sample window and an LSTM state to a speech
probability and the next state. The model is loaded once (read-only, shared by
every session); each ``SileroVad`` keeps its own state, context and leftover
samples, so sessions never see each other's audio. The input is resampled to
16 kHz as it arrives (``StreamResampler``); turn edges come from ``TurnTracker``
and are reported at the input's rate.

The package is never imported: its ``__init__`` calls ``torch.set_num_threads(1)``
for the whole process. Its data folder is found with ``find_spec`` (which imports
nothing) and the model file loaded with ``torch.jit.load``.
"""

from __future__ import annotations

import importlib.util
import logging
from functools import cache
from pathlib import Path

import numpy as np
import torch

from omnistage.audio.resample_stream import StreamResampler
from omnistage.audio.turn_judge import TurnJudge
from omnistage.audio.vad import TurnTracker, VadConfig, VadEvent

logger = logging.getLogger(__name__)

RATE = 16_000
WINDOW = 512  # samples the 16 kHz model takes at once (32 ms)
CONTEXT = 64  # samples of the previous window it sees again
STATE_SHAPE = (2, 1, 128)  # the LSTM's (h, c) for one stream
STOP_MARGIN = 0.15  # a turn ends below threshold - 0.15, as in Silero's VADIterator
WINDOW_MS = WINDOW * 1000 / RATE


class SileroUnavailable(RuntimeError):
    """The package or its model file is missing, or the model does not load."""


def model_path() -> Path:
    spec = importlib.util.find_spec("silero_vad")
    if spec is None or not spec.submodule_search_locations:
        raise SileroUnavailable("the silero-vad package is not installed")
    path = Path(next(iter(spec.submodule_search_locations))) / "data" / "silero_vad.jit"
    if not path.is_file():
        raise SileroUnavailable(f"silero-vad has no model file at {path}")
    return path


@cache
def load_model() -> torch.jit.ScriptModule:
    """The shared 16 kHz network, warmed up (TorchScript optimises a function on its first calls)."""
    path = model_path()
    try:
        model = torch.jit.load(str(path), map_location="cpu")._model.eval()
        with torch.inference_mode():
            for _ in range(3):
                model(torch.zeros(1, CONTEXT + WINDOW), torch.zeros(STATE_SHAPE))
    except Exception as exc:  # noqa: BLE001 - any failure to load means the fallback
        raise SileroUnavailable(f"could not load {path}: {exc}") from exc
    logger.info("Silero VAD loaded from %s", path)
    return model


class SileroVad:
    """Streams samples in any piece sizes at ``sample_rate``; yields start/stop events at window resolution."""

    inline = False  # ~1 ms of CPU a window: run off the event loop

    def __init__(self, config: VadConfig, sample_rate: int, model: torch.jit.ScriptModule,
                 judge: TurnJudge | None = None) -> None:
        """``judge``: semantic_vad's, at 16 kHz and this detector's windows (None: pauses are only reported)."""
        self.config, self.rate, self.model, self.judge = config, sample_rate, model, judge
        self._resample = StreamResampler(sample_rate, RATE)
        self._turns = TurnTracker(config, WINDOW_MS)
        self.reset()

    @property
    def in_speech(self) -> bool:
        return self._turns.in_speech

    def reset(self) -> None:
        self._resample.reset()
        self._turns.reset()
        self._pending = np.zeros(0, np.float32)
        self._context = torch.zeros(1, CONTEXT)
        self._state = torch.zeros(STATE_SHAPE)
        if self.judge is not None:
            self.judge.reset()

    def probabilities(self, samples: np.ndarray) -> list[float]:
        """Speech probability of each whole 16 kHz window completed by ``samples``."""
        data = np.concatenate([self._pending, self._resample(samples)])
        n = len(data) // WINDOW
        self._pending = data[n * WINDOW:]
        if self.judge is not None:
            self.judge.heard(data[: n * WINDOW])
        probs: list[float] = []
        with torch.inference_mode():
            for window in torch.from_numpy(data[: n * WINDOW]).view(n, WINDOW):
                x = torch.cat([self._context, window.unsqueeze(0)], dim=1)
                out, self._state = self.model(x, self._state)
                self._context = x[:, -CONTEXT:]
                probs.append(float(out))
        return probs

    def feed(self, samples: np.ndarray) -> list[VadEvent]:
        start = self.config.threshold
        edges = self._turns.update(self.probabilities(samples), start, max(start - STOP_MARGIN, 0.01), self.judge)
        return [VadEvent(kind, frame * WINDOW * self.rate // RATE) for kind, frame in edges]
