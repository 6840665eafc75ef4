"""Weight-only int8: one scale per output row, symmetric over [-127, 127], activations left as they are.

CPU: torch's int8 weight-packed matmul (``aten._weight_int8pack_mm``, bf16 activations and scales, fp32
accumulation). At decode it reads a quarter of an fp32 weight's bytes; measured with one thread on this
project's AMD EPYC it runs a 1536x2048 matrix-vector product about 2x faster than fp32 MKL, and keeps level with
fp32 up to about 100 rows. It needs the input width to be a multiple of 16 (other widths give wrong results,
not errors), so other shapes dequantise and multiply. CUDA: :mod:`omnistage.layers.quant.int8_triton`.
"""

from __future__ import annotations

import torch

from omnistage.layers.quant import int8_triton

INT8_MAX = 127
# aten._weight_int8pack_mm's CPU kernel walks the input width 16 values at a time.
PACK_K = 16


def scale_dtype(device: torch.device, dtype: torch.dtype) -> torch.dtype:
    """What the scales are stored in: bf16 on CPU (torch's kernel multiplies by bf16 scales), else the model's
    dtype or float32, whichever is wider."""
    if device.type == "cpu":
        return torch.bfloat16
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def quantize_rows(weight: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """``[..., N, K]`` -> int8 values of the same shape and scales ``[..., N]`` (in ``dtype``)."""
    amax = weight.detach().abs().amax(dim=-1).float().clamp_min(torch.finfo(torch.float32).tiny)
    scale = (amax / INT8_MAX).to(dtype)
    # Divide by the stored (rounded) scale: values and scale then agree exactly with what the kernel multiplies.
    q = torch.round(weight.detach().float() / scale.float().unsqueeze(-1)).clamp_(-INT8_MAX, INT8_MAX)
    return q.to(torch.int8), scale


def dequantize_rows(q: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return (q.float() * scale.float().unsqueeze(-1)).to(dtype)


def int8_linear(x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """``x @ dequantize(q, scale).T`` for ``x [..., K]``, ``q [N, K]`` int8, ``scale [N]``; in x's dtype."""
    rows = x.reshape(-1, x.shape[-1])
    if x.device.type == "cpu" and q.shape[1] % PACK_K == 0:
        out = torch.ops.aten._weight_int8pack_mm(rows.to(torch.bfloat16).contiguous(), q,
                                                 scale.to(torch.bfloat16))
    elif x.is_cuda and int8_triton.AVAILABLE:
        out = int8_triton.w8_linear(rows, q, scale)
    else:
        out = rows @ dequantize_rows(q, scale, rows.dtype).t()
    return out.to(x.dtype).reshape(*x.shape[:-1], q.shape[0])
