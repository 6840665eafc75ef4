"""torchaudio's default resampling (``functional.resample``: a Hann-windowed sinc, 6 zero crossings, roll-off
0.99) in plain torch: the reference tokenizer resamples its encoder's input to 16 kHz with it, and its HuBERT
features (so a cloned voice's codes) follow the resampler's every sample. Serving needs no torchaudio."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

ZERO_CROSSINGS, ROLLOFF = 6, 0.99


def _kernel(orig: int, new: int) -> tuple[torch.Tensor, int]:
    """The polyphase filters ``[new, 1, taps]`` (computed in float64, as the reference does) and their half width."""
    base = min(orig, new) * ROLLOFF
    width = math.ceil(ZERO_CROSSINGS * orig / base)
    idx = torch.arange(-width, width + orig, dtype=torch.float64)[None, None] / orig
    t = (torch.arange(0, -new, -1)[:, None, None] / new + idx) * base
    t = t.clamp(-ZERO_CROSSINGS, ZERO_CROSSINGS)
    window = torch.cos(t * math.pi / ZERO_CROSSINGS / 2) ** 2
    t = t * math.pi
    kernels = torch.where(t == 0, torch.tensor(1.0, dtype=t.dtype), t.sin() / t) * window * (base / orig)
    return kernels.to(torch.float32), width


def sinc_resample(wave: torch.Tensor, orig_rate: int, new_rate: int) -> torch.Tensor:
    """Mono float audio ``[S]`` from ``orig_rate`` to ``new_rate``: ``ceil(S * new / orig)`` samples."""
    if orig_rate == new_rate:
        return wave
    gcd = math.gcd(orig_rate, new_rate)
    orig, new = orig_rate // gcd, new_rate // gcd
    kernel, width = _kernel(orig, new)
    padded = F.pad(wave.float()[None], (width, width + orig))
    out = F.conv1d(padded[:, None], kernel, stride=orig).transpose(1, 2).reshape(-1)
    return out[:math.ceil(new * wave.shape[-1] / orig)]
