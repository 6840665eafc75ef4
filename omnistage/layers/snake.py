"""``sin_squared_``: the periodic half of the Snake activations vocoders run at every sample rate up to 24 kHz.

torch's CPU ``sin`` is scalar-accurate and slow (~1 ns an element here); numpy's float32 ``sin`` is SIMD and
within 1 ulp of it (~0.4 ns). A tiny vocoder (Higgs Audio v2's tiny xcodec) spent 38% of its decode in ``sin``, so
float32 tensors on the CPU outside autograd take numpy's, in place on the tensor's own memory.
"""

from __future__ import annotations

import numpy as np
import torch


def sin_squared_(x: torch.Tensor) -> torch.Tensor:
    """``x`` overwritten with ``sin(x) ** 2`` (and returned)."""
    if x.device.type == "cpu" and x.dtype == torch.float32 and x.is_contiguous() and not x.requires_grad:
        values = x.numpy()
        np.sin(values, out=values)
        np.square(values, out=values)
        return x
    return x.sin_().square_()
