"""FP8 (e4m3) weights of pre-quantized checkpoints: scales per tensor, per output row, or per block.

On a CPU (and for block scales everywhere) the weights are dequantised once, at load, into the model's dtype:
``dequantize_fp8``. On GPUs with FP8 tensor cores (compute capability 8.9+: Ada, Hopper, Blackwell) per-tensor and
per-row scaled weights stay in FP8 and run through ``torch._scaled_mm``, the activations quantised per row on the
fly (dynamic per-token scales, as vLLM's FP8 path does when a checkpoint's static ``input_scale`` is not used);
the per-tensor scale is kept as one scale per row, so q/k/v or gate/up with different scales stack into one GEMM.
Other GPUs widen the FP8 weights in registers (:mod:`omnistage.layers.quant.int8_triton`).
"""

from __future__ import annotations

import torch

FP8 = torch.float8_e4m3fn
FP8_MAX = float(torch.finfo(FP8).max)  # 448
# torch._scaled_mm wants both GEMM dimensions of its FP8 operands in multiples of 16.
_SCALED_MM_ALIGN = 16


def fp8_gemm_supported(device: torch.device) -> bool:
    """Whether ``device`` multiplies FP8 natively (CUDA, compute capability 8.9 or newer)."""
    return device.type == "cuda" and torch.cuda.get_device_capability(device) >= (8, 9)


def scale_layout(scale: torch.Tensor, shape: tuple[int, int], block: tuple[int, int] | None) -> str:
    """``tensor``, ``row`` or ``block``: how ``scale`` covers a weight of ``shape`` ``[N, K]``."""
    n, k = shape
    if scale.numel() == 1:
        return "tensor"
    if scale.dim() == 1 and scale.shape[0] == n or scale.dim() == 2 and tuple(scale.shape) == (n, 1):
        return "row"
    if block is not None and scale.dim() == 2 and tuple(scale.shape) == (-(-n // block[0]), -(-k // block[1])):
        return "block"
    raise ValueError(f"an FP8 scale of shape {tuple(scale.shape)} fits no layout of a {n}x{k} weight "
                     f"(block {block})")


def row_scales(scale: torch.Tensor, rows: int) -> torch.Tensor:
    """A per-tensor or per-row scale as one float32 scale per output row ``[rows]``."""
    flat = scale.float().flatten()
    return flat.expand(rows).clone() if flat.numel() == 1 else flat


def dequantize_fp8(q: torch.Tensor, scale: torch.Tensor, block: tuple[int, int] | None = None,
                   dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The full-precision weight ``q * scale`` of an FP8 ``q [N, K]`` under any of the three scale layouts."""
    n, k = q.shape
    layout = scale_layout(scale, (n, k), block)
    s = scale.float()
    if layout == "tensor":
        full = q.float() * s.reshape(())
    elif layout == "row":
        full = q.float() * s.reshape(n, 1)
    else:
        bn, bk = block
        full = q.float() * s.repeat_interleave(bn, 0)[:n].repeat_interleave(bk, 1)[:, :k]
    return full.to(dtype)


def quantize_fp8(weight: torch.Tensor, block: tuple[int, int] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """What a quantizer writes: FP8 values and a float32 scale, per tensor (``block`` None: a 0-d scale, the
    ModelOpt layout) or per ``block`` (``[ceil(N/bn), ceil(K/bk)]``)."""
    w = weight.detach().float()
    tiny = torch.finfo(torch.float32).tiny
    if block is None:
        scale = (w.abs().amax() / FP8_MAX).clamp_min(tiny)
        return (w / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8), scale
    n, k = w.shape
    bn, bk = block
    padded = torch.zeros(-(-n // bn) * bn, -(-k // bk) * bk)
    padded[:n, :k] = w
    blocks = padded.view(padded.shape[0] // bn, bn, padded.shape[1] // bk, bk)
    scale = (blocks.abs().amax(dim=(1, 3)) / FP8_MAX).clamp_min(tiny)
    expanded = scale.repeat_interleave(bn, 0)[:n].repeat_interleave(bk, 1)[:, :k]
    return (w / expanded).clamp(-FP8_MAX, FP8_MAX).to(FP8), scale


def fp8_linear(x: torch.Tensor, w: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """``x [..., K] @ (w [N, K] * scale[:, None]).T`` with FP8 ``w`` and per-row float32 ``scale [N]``.

    With ``torch._scaled_mm`` (FP8 GPUs; torch also runs it on CPUs, which the tests use): ``x`` is quantised
    per row to FP8 first, so the result differs from the dequantised product by the activations' rounding
    (e4m3: 3 mantissa bits). Otherwise the weight is widened and the product is exact to the compute dtype.
    """
    rows = x.reshape(-1, x.shape[-1])
    n, k = w.shape
    aligned = n % _SCALED_MM_ALIGN == 0 and k % _SCALED_MM_ALIGN == 0
    if aligned and (fp8_gemm_supported(x.device) or x.device.type == "cpu"):
        amax = rows.abs().amax(dim=-1, keepdim=True).float().clamp_min(torch.finfo(torch.float32).tiny)
        x_scale = amax / FP8_MAX
        xq = (rows.float() / x_scale).clamp_(-FP8_MAX, FP8_MAX).to(FP8)
        # Row-wise scaled FP8 GEMMs on CUDA write bf16; the result is cast to x's dtype after.
        out_dtype = torch.bfloat16 if x.is_cuda else x.dtype
        out = torch._scaled_mm(xq, w.t(), scale_a=x_scale, scale_b=scale.float().view(1, n), out_dtype=out_dtype)
    else:
        from omnistage.layers.quant import int8_triton

        if x.is_cuda and int8_triton.AVAILABLE:
            out = int8_triton.w8_linear(rows.contiguous(), w, scale)
        else:
            out = rows @ (w.to(rows.dtype) * scale.to(rows.dtype).view(n, 1)).t()
    return out.to(x.dtype).reshape(*x.shape[:-1], n)
