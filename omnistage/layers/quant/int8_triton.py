"""A weight-only 1-byte GEMM on GPU: ``x [M, K] @ (w [N, K] * scale[:, None]).T`` with ``w`` int8 or FP8.

The 1-byte weights are read once and widened in registers to the activations' dtype; the per-row scale
multiplies the fp32 accumulator at the end. Used for int8 weights on CUDA, and for FP8 weights where the GPU has
no FP8 tensor cores. Tested on CPU under Triton's interpreter (int8) against the dequantised product.
"""

from __future__ import annotations

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # the CPU install has no Triton
    triton = None

AVAILABLE = triton is not None

if AVAILABLE:

    @triton.jit
    def _w8_gemm_kernel(
        a_ptr, b_ptr, s_ptr, c_ptr, M, N, K,
        stride_am, stride_ak, stride_bn, stride_bk, stride_cm, stride_cn,
        IEEE_FP32: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    ):
        pid_m = tl.program_id(0)
        pid_n = tl.program_id(1)
        offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        offs_k = tl.arange(0, BLOCK_K)
        a_ptrs = a_ptr + offs_m.to(tl.int64)[:, None] * stride_am + offs_k[None, :] * stride_ak
        b_ptrs = b_ptr + offs_n.to(tl.int64)[None, :] * stride_bn + offs_k[:, None] * stride_bk
        acc = tl.full((BLOCK_M, BLOCK_N), 0.0, dtype=tl.float32)
        for k0 in range(0, (K + BLOCK_K - 1) // BLOCK_K):
            k_ok = offs_k < K - k0 * BLOCK_K
            a = tl.load(a_ptrs, mask=(offs_m[:, None] < M) & k_ok[None, :], other=0.0)
            b = tl.load(b_ptrs, mask=k_ok[:, None] & (offs_n[None, :] < N), other=0).to(a.dtype)
            if IEEE_FP32:
                acc += tl.dot(a, b, input_precision="ieee")
            else:
                acc += tl.dot(a, b)
            a_ptrs += BLOCK_K * stride_ak
            b_ptrs += BLOCK_K * stride_bk
        scale = tl.load(s_ptr + offs_n, mask=offs_n < N, other=0.0).to(tl.float32)
        acc = acc * scale[None, :]
        c_ptrs = c_ptr + offs_m.to(tl.int64)[:, None] * stride_cm + offs_n[None, :] * stride_cn
        tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))


def w8_linear(x: torch.Tensor, w: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """``x [M, K]`` (fp32/bf16/fp16) times the scaled 1-byte ``w [N, K]`` transposed -> ``[M, N]`` in x's dtype."""
    if not AVAILABLE:
        raise RuntimeError("w8_linear needs Triton")
    m, k = x.shape
    n = w.shape[0]
    out = x.new_empty(m, n)
    block_m = 16 if m <= 16 else 32 if m <= 64 else 64
    block_n, block_k = 64, 64
    grid = (triton.cdiv(m, block_m), triton.cdiv(n, block_n))
    _w8_gemm_kernel[grid](
        x, w, scale, out, m, n, k, x.stride(0), x.stride(1), w.stride(0), w.stride(1), out.stride(0),
        out.stride(1), IEEE_FP32=x.dtype == torch.float32, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k,
    )
    return out
