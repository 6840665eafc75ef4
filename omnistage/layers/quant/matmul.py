"""One entry for every 1-byte weight: ``x @ (weight * scale[:, None]).T`` by the weight's storage dtype."""

from __future__ import annotations

import torch

from omnistage.layers.quant.fp8 import FP8, fp8_linear
from omnistage.layers.quant.int8 import PACK_K, int8_linear
from omnistage.layers.quant.w8a8 import W8A8_MIN_ROWS, w8a8_linear

QUANTIZED_DTYPES = (torch.int8, FP8)


def is_quantized(weight: torch.Tensor) -> bool:
    return weight.dtype in QUANTIZED_DTYPES


def quantized_linear(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor,
                     bias: torch.Tensor | None = None, dynamic_inputs: bool = False) -> torch.Tensor:
    """int8 (weight-only) or FP8 ``weight [N, K]`` with one scale per output row ``scale [N]``.
    ``dynamic_inputs``: an int8 weight on CPU multiplies per-token int8 activations from ``W8A8_MIN_ROWS`` rows
    up (:mod:`omnistage.layers.quant.w8a8`)."""
    if weight.dtype == torch.int8 and dynamic_inputs and _w8a8_applies(x, weight):
        out = w8a8_linear(x.reshape(-1, x.shape[-1]), weight, scale)
        out = out.to(x.dtype).reshape(*x.shape[:-1], weight.shape[0])
    elif weight.dtype == torch.int8:
        out = int8_linear(x, weight, scale)
    elif weight.dtype == FP8:
        out = fp8_linear(x, weight, scale)
    else:
        raise TypeError(f"not a quantized weight dtype: {weight.dtype}")
    return out if bias is None else out + bias


def _w8a8_applies(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """CPU, enough rows, and an input width the int8 kernels walk in whole blocks."""
    return x.device.type == "cpu" and x.numel() // x.shape[-1] >= W8A8_MIN_ROWS and weight.shape[1] % PACK_K == 0
