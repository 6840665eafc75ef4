"""Smart Turn v3.2: an end-of-turn classifier over the last 8 s of a speaker's audio (``semantic_vad``).

The model is the ONNX file ``smart-turn-v3.2-cpu.onnx`` that the ``pipecat-ai``
package ships (``pipecat/audio/turn/smart_turn/data/``; pipecat-ai is BSD-2-Clause,
"Copyright (c) 2024–2026, Daily", its LICENSE in the wheel's ``licenses/``). It is
installed by the ``turn`` extra (``pip install 'omnistage[turn]'``) with
onnxruntime; nothing is fetched at run time. pipecat itself is never imported (its
``__init__`` logs a banner and its analyzer drags its pipeline types in): the data
folder is found with ``find_spec``, which imports nothing, and the file is loaded
with onnxruntime on the CPU.

The input is prepared as pipecat's ``LocalSmartTurnAnalyzerV3`` prepares it: 16 kHz
mono float, the turn from 500 ms before its speech start to what was heard, its last
8 s kept (shorter: zeros in front), then Whisper's log-mel features (80 bins, 25 ms
window, 10 ms hop, the waveform normalised to zero mean and unit variance first; 800
frames). The model's output is the probability that the turn is complete; above 0.5
is "complete", as pipecat decides.
"""

from __future__ import annotations

import importlib.util
import logging
from functools import cache
from pathlib import Path

import numpy as np

logger = logging.getLogger(__name__)

RATE = 16_000
WINDOW_S = 8  # the model's audio: the last 8 s, zero-padded in front
PRE_SPEECH_MS = 500  # audio kept before the turn's speech start (pipecat's PRE_SPEECH_MS)
THRESHOLD = 0.5  # the probability above which a turn is complete (pipecat's)
N_FFT, HOP, N_MELS = 400, 160, 80
MODEL_FILE = ("audio", "turn", "smart_turn", "data", "smart-turn-v3.2-cpu.onnx")
EXTRA_HINT = "pip install 'omnistage[turn]' (pipecat-ai ships the model, onnxruntime runs it)"


class SmartTurnUnavailable(RuntimeError):
    """pipecat-ai (the model file) or onnxruntime is missing, or the model does not load."""


def model_path() -> Path:
    spec = importlib.util.find_spec("pipecat")
    if spec is None or not spec.submodule_search_locations:
        raise SmartTurnUnavailable(f"the pipecat-ai package is not installed: {EXTRA_HINT}")
    path = Path(next(iter(spec.submodule_search_locations))).joinpath(*MODEL_FILE)
    if not path.is_file():
        raise SmartTurnUnavailable(f"pipecat-ai has no Smart Turn model at {path}")
    return path


@cache
def _mel_filters() -> np.ndarray:
    """Whisper's Slaney mel bank ``[freq bins, mels]`` (transformers' WhisperFeatureExtractor builds the same)."""
    from transformers.audio_utils import mel_filter_bank

    return mel_filter_bank(num_frequency_bins=N_FFT // 2 + 1, num_mel_filters=N_MELS, min_frequency=0.0,
                           max_frequency=RATE / 2, sampling_rate=RATE, norm="slaney", mel_scale="slaney")


def last_window(audio: np.ndarray) -> np.ndarray:
    """The last 8 s of ``audio`` (16 kHz), zeros in front when shorter."""
    n = WINDOW_S * RATE
    audio = np.asarray(audio, dtype=np.float32)[-n:]
    return np.pad(audio, (n - len(audio), 0))


def features(audio: np.ndarray) -> np.ndarray:
    """Whisper's log-mel ``[80, 800]`` of exactly 8 s of 16 kHz audio (:func:`last_window`)."""
    x = np.asarray(audio, dtype=np.float32)
    x = (x - x.mean()) / np.sqrt(x.var() + 1e-7)  # before the spectrogram, in float32, as Whisper's extractor
    padded = np.pad(x.astype(np.float64), N_FFT // 2, mode="reflect")
    frames = np.lib.stride_tricks.sliding_window_view(padded, N_FFT)[::HOP]
    window = np.hanning(N_FFT + 1)[:-1]  # periodic Hann, as torch.hann_window
    power = np.abs(np.fft.rfft(frames * window, axis=-1)) ** 2
    log_spec = np.log10(np.maximum(power @ _mel_filters(), 1e-10)).T[:, :-1]  # the last frame dropped
    log_spec = np.maximum(log_spec, log_spec.max() - 8.0)
    return ((log_spec + 4.0) / 4.0).astype(np.float32)


class SmartTurn:
    """The loaded classifier; one onnxruntime session shared by every stream (its ``run`` is thread-safe)."""

    def __init__(self, path: Path) -> None:
        try:
            import onnxruntime as ort
        except ImportError as exc:
            raise SmartTurnUnavailable(f"onnxruntime is not installed: {EXTRA_HINT}") from exc
        options = ort.SessionOptions()
        # One thread a call: it runs in the VAD pool beside other sessions' detectors, on a CPU the engine uses.
        options.intra_op_num_threads, options.inter_op_num_threads = 1, 1
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        try:
            self.session = ort.InferenceSession(str(path), sess_options=options, providers=["CPUExecutionProvider"])
        except Exception as exc:  # noqa: BLE001 - a model that does not load is the same as none
            raise SmartTurnUnavailable(f"could not load {path}: {exc}") from exc
        self.path = path

    def probability(self, audio: np.ndarray) -> float:
        """How likely the turn whose 16 kHz audio (speech start to now) is ``audio`` is complete."""
        mel = features(last_window(audio))
        (logits,) = self.session.run(None, {"input_features": mel[None]})
        return float(np.asarray(logits).reshape(-1)[0])  # the exported model ends in its sigmoid

    def complete(self, audio: np.ndarray) -> bool:
        return self.probability(audio) > THRESHOLD


@cache
def load_smart_turn() -> SmartTurn:
    """The shared classifier, warmed up (onnxruntime plans its kernels on the first run)."""
    model = SmartTurn(model_path())
    model.probability(np.zeros(RATE, np.float32))
    logger.info("Smart Turn v3.2 loaded from %s", model.path)
    return model
