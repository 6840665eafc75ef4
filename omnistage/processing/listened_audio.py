"""Audio features made while the user is still speaking (streaming input), window by window.

An audio encoder that attends within fixed windows of mel frames (Qwen3-Omni's
AuT: ``n_window_infer`` frames, 8 s) gives a completed window the same rows
whatever follows it, so its features can be made, encoded and prefilled before
the turn ends. :class:`WindowedLogMel` follows a growing 16 kHz clip and
freezes each window's Whisper log-mel once the audio reaches ``n_fft`` samples
past its end (its last STFT frame and the resampler's filter then see only real
samples, as in the whole clip). :class:`ListenedAudio` carries the frozen
windows into the prompt: the processor uses them for the clip's leading frames
and computes only the frames after them (:func:`listened_features`, as the
whole-clip pass makes them), so the prompt's keys and KV rows of those windows
are the ones prefilled while the user spoke, and the work left at the turn's
end does not grow with its length.

Whisper's level floor is non-causal: every log-mel value is raised to at least
the clip's maximum − 8 (log10 units, 80 dB), and a louder moment later in the
clip raises the floor of earlier frames. A frozen window keeps the floor of the
running maximum at the time it completed (the maximum over the windows done so
far). Against the whole-clip pass a frozen value therefore differs only where
it lies more than 80 dB below the clip's peak, and by at most
``(peak − the running peak when its window froze) / 4`` in the extractor's scaled units; everywhere else,
and whenever the loudest moment falls in a completed window, it is the same
(up to float rounding of the STFT over a shorter clip: 1e-5).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import numpy as np
import torch

FLOOR = 8.0  # Whisper: log10 mel clamped at the clip's max - 8


@dataclass(frozen=True, eq=False)
class ListenedAudio:
    """A user's audio (16 kHz mono float32) with the log-mel ``head [mel, frames]`` of its leading completed
    encoder windows, made while it was spoken."""

    samples: np.ndarray
    head: torch.Tensor

    def __len__(self) -> int:
        return len(self.samples)


@runtime_checkable
class StreamingAudioInput(Protocol):
    """A prompt processor that can freeze a growing audio's features window by window (and take them back as
    :class:`ListenedAudio` in ``process``)."""

    def listener(self) -> WindowedLogMel | None:
        """A fresh follower of one growing clip; None when the audio encoder has no windows to complete."""
        ...


def log_mel(extractor, samples: np.ndarray) -> torch.Tensor:  # noqa: ANN001 - transformers' WhisperFeatureExtractor
    """Whisper's log10 mel ``[mel, len // hop]`` of ``samples``, before its clip-wide floor and scaling (the
    extractor's own torch path, step for step)."""
    waveform = torch.from_numpy(np.ascontiguousarray(samples, dtype=np.float32))[None]
    window = torch.hann_window(extractor.n_fft)
    stft = torch.stft(waveform, extractor.n_fft, extractor.hop_length, window=window, return_complex=True)
    magnitudes = (stft[..., :-1].abs() ** 2).contiguous()
    mel = torch.from_numpy(extractor.mel_filters).to(torch.float32).T @ magnitudes
    return torch.clamp(mel, min=1e-10).log10()[0]


def log_mel_from(extractor, samples: np.ndarray, start: int, end: int | None = None) -> torch.Tensor:  # noqa: ANN001
    """:func:`log_mel` of ``samples[start:end]`` (``start`` a frame boundary) as the whole clip's STFT frames it. A
    piece's first frame is reflect-padded at its start, where the clip's is not: the piece starts up to one
    ``n_fft`` earlier, and the frames of that lead go."""
    hop = extractor.hop_length
    lead = min(start, extractor.n_fft)
    lead -= lead % hop
    return log_mel(extractor, samples[start - lead:end])[:, lead // hop:]


def floored(log_spec: torch.Tensor, peak: float) -> torch.Tensor:
    """Whisper's floor at ``peak - 8`` and its scaling: the extractor's output values."""
    return (torch.maximum(log_spec, torch.tensor(peak - FLOOR)) + 4.0) / 4.0


@dataclass
class WindowedLogMel:
    """The frozen log-mel windows of one growing clip (``window_frames`` mel frames each)."""

    extractor: object  # WhisperFeatureExtractor
    window_frames: int
    windows: list[torch.Tensor] = field(default_factory=list)
    peak: float = float("-inf")  # the largest log10 mel value of the windows frozen so far

    @property
    def window_samples(self) -> int:
        return self.window_frames * self.extractor.hop_length

    @property
    def lookahead(self) -> int:
        return self.extractor.n_fft

    def completed(self, num_samples: int) -> int:
        """How many windows ``num_samples`` of audio complete."""
        return max(0, (num_samples - self.lookahead) // self.window_samples)

    def advance(self, samples: np.ndarray) -> int:
        """Freezes the windows that ``samples`` (the clip so far) newly completes; returns how many."""
        target = self.completed(len(samples))
        done = len(self.windows)
        if target <= done:
            return 0
        log = log_mel_from(self.extractor, samples, done * self.window_samples,
                           target * self.window_samples + self.lookahead)
        for k in range(target - done):
            window = log[:, k * self.window_frames:(k + 1) * self.window_frames]
            self.peak = max(self.peak, float(window.max()))
            self.windows.append(floored(window, self.peak))
        return target - done

    def head(self) -> torch.Tensor | None:
        return torch.cat(self.windows, dim=1) if self.windows else None


def listened_features(extractor, audio: ListenedAudio) -> torch.Tensor:  # noqa: ANN001 - WhisperFeatureExtractor
    """``audio``'s features ``[mel, len // hop]``: its frozen head, then the frames after it as the extractor's
    whole-clip pass makes them. Only those are computed (:func:`log_mel_from` the head's end, as
    :meth:`WindowedLogMel.advance` frames a window), floored at the clip's peak: the larger of theirs and the
    head's, whose raw peak its scaled maximum gives back (``4·max − 4``; the head's windows froze with its peak
    raw value in them). Equal to the whole-clip pass with the head put in front, up to float rounding of the
    STFT over a shorter piece and of that peak (1e-5)."""
    hop = extractor.hop_length
    frames, done = len(audio.samples) // hop, audio.head.shape[1]
    if done > frames:
        raise ValueError(f"listened features of {done} frames do not fit an audio of {frames}")
    if done == frames:
        return audio.head
    log = log_mel_from(extractor, audio.samples, done * hop)
    peak = max(4.0 * float(audio.head.max()) - 4.0 if done else float("-inf"), float(log.max()))
    return torch.cat([audio.head, floored(log, peak)], dim=1)
