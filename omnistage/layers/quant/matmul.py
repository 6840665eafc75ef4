"""One entry for every 1-byte weight: ``x @ (weight * scale[:, None]).T`` by the weight's storage dtype."""

from __future__ import annotations

import torch

from omnistage.layers.quant.fp8 import FP8, fp8_linear
from omnistage.layers.quant.int8 import int8_linear

QUANTIZED_DTYPES = (torch.int8, FP8)


def is_quantized(weight: torch.Tensor) -> bool:
    return weight.dtype in QUANTIZED_DTYPES


def quantized_linear(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor,
                     bias: torch.Tensor | None = None) -> torch.Tensor:
    """int8 (weight-only) or FP8 ``weight [N, K]`` with one scale per output row ``scale [N]``."""
    if weight.dtype == torch.int8:
        out = int8_linear(x, weight, scale)
    elif weight.dtype == FP8:
        out = fp8_linear(x, weight, scale)
    else:
        raise TypeError(f"not a quantized weight dtype: {weight.dtype}")
    return out if bias is None else out + bias
