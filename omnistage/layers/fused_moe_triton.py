"""Fused MoE on GPU: one Triton kernel over all experts, no host sync, capturable in CUDA graphs.

vLLM's ``fused_moe`` scheme. The ``T * top_k`` (token, expert) pairs are
sorted by expert and each expert's run is padded to a multiple of ``BLOCK_M``
(:func:`align_pairs`, plain tensor ops with fixed shapes: the buffers are sized
for the worst case, ``pairs + experts * (BLOCK_M - 1)``, and the real length
stays on the device). One kernel launch then computes every block of
``BLOCK_M`` pairs of one expert against that expert's weights, read in place
from the fused ``[E, N, K]`` tensor; blocks past the real length exit at once.
It runs twice per layer (gate/up, then down with the routing weight folded
in); the activation between is one elementwise op and the top-k sum one
reduction. Each active expert's weights are read once per ``BLOCK_N`` column
tile of each of its blocks: once in all for a decode batch (one block per
expert). Quantized experts (int8 or FP8 values, one scale per row) are widened
to the activations' dtype in registers and their scales multiply the
accumulator, so the weights are read as the 1-byte values they are stored as.

Tested on CPU under Triton's interpreter (``TRITON_INTERPRET=1``) against
:mod:`omnistage.layers.moe_torch`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # the CPU install has no Triton; GPU builds of torch ship it
    triton = None

AVAILABLE = triton is not None


class PairLayout(NamedTuple):
    """Expert-sorted, block-padded pairs: all device tensors, shapes fixed by (pairs, experts, block_m)."""

    sorted_pairs: torch.Tensor  # int32 [max_padded]: pair index, or num_pairs for padding
    block_experts: torch.Tensor  # int32 [max_padded // block_m]: the expert of each block
    num_padded: torch.Tensor  # int32 [1]: real padded length (blocks past it do nothing)


def align_pairs(ids: torch.Tensor, num_experts: int, block_m: int) -> PairLayout:
    """Sorts ``ids [T, k]``'s pairs by expert and pads each expert's run to a multiple of ``block_m``."""
    flat = ids.flatten().long()
    num_pairs = flat.numel()
    ones = torch.ones_like(flat, dtype=torch.int64)
    # scatter_add, not bincount: bincount learns its output size on the host.
    counts = torch.zeros(num_experts, dtype=torch.int64, device=flat.device).scatter_add_(0, flat, ones)
    padded = (counts + block_m - 1) // block_m * block_m
    ends = torch.cumsum(padded, 0)
    order = torch.argsort(flat, stable=True)
    by_expert = flat[order]
    first_of_expert = torch.cumsum(counts, 0) - counts
    rank = torch.arange(num_pairs, device=flat.device) - first_of_expert[by_expert]
    dest = (ends - padded)[by_expert] + rank
    max_padded = -(-(num_pairs + num_experts * (block_m - 1)) // block_m) * block_m
    sorted_pairs = torch.full((max_padded,), num_pairs, dtype=torch.int32, device=flat.device)
    sorted_pairs.scatter_(0, dest, order.to(torch.int32))
    block_starts = torch.arange(0, max_padded, block_m, device=flat.device)
    block_experts = torch.searchsorted(ends, block_starts, right=True).clamp_max_(num_experts - 1)
    return PairLayout(sorted_pairs, block_experts.to(torch.int32), ends[-1:].to(torch.int32))


if AVAILABLE:

    @triton.jit
    def _expert_gemm_kernel(
        a_ptr, b_ptr, c_ptr, w_ptr, s_ptr, pairs_ptr, experts_ptr, num_padded_ptr,
        N, K, num_pairs, rows_per_a,
        stride_am, stride_ak, stride_be, stride_bn, stride_bk, stride_cm, stride_cn, stride_se,
        MUL_WEIGHT: tl.constexpr, SCALED: tl.constexpr, IEEE_FP32: tl.constexpr,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    ):
        """C[pair] = A[pair // rows_per_a] @ B[expert].T (times the pair's weight) for one [BLOCK_M, BLOCK_N] tile."""
        pid_m = tl.program_id(0)
        pid_n = tl.program_id(1)
        if pid_m * BLOCK_M >= tl.load(num_padded_ptr):
            return
        offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        pair = tl.load(pairs_ptr + offs_m)
        valid = pair < num_pairs
        expert = tl.load(experts_ptr + pid_m).to(tl.int64)
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        offs_k = tl.arange(0, BLOCK_K)
        a_row = (pair // rows_per_a).to(tl.int64)
        a_ptrs = a_ptr + a_row[:, None] * stride_am + offs_k[None, :] * stride_ak
        b_ptrs = b_ptr + expert * stride_be + offs_n[None, :] * stride_bn + offs_k[:, None] * stride_bk
        acc = tl.full((BLOCK_M, BLOCK_N), 0.0, dtype=tl.float32)
        for k0 in range(0, (K + BLOCK_K - 1) // BLOCK_K):
            k_ok = offs_k < K - k0 * BLOCK_K
            a = tl.load(a_ptrs, mask=valid[:, None] & k_ok[None, :], other=0.0)
            b = tl.load(b_ptrs, mask=k_ok[:, None] & (offs_n[None, :] < N), other=0.0)
            if SCALED:
                b = b.to(a.dtype)
            if IEEE_FP32:
                acc += tl.dot(a, b, input_precision="ieee")
            else:
                acc += tl.dot(a, b)
            a_ptrs += BLOCK_K * stride_ak
            b_ptrs += BLOCK_K * stride_bk
        if SCALED:
            scale = tl.load(s_ptr + expert * stride_se + offs_n, mask=offs_n < N, other=0.0).to(tl.float32)
            acc = acc * scale[None, :]
        if MUL_WEIGHT:
            acc = acc * tl.load(w_ptr + pair, mask=valid, other=0.0).to(tl.float32)[:, None]
        c_ptrs = c_ptr + pair.to(tl.int64)[:, None] * stride_cm + offs_n[None, :] * stride_cn
        tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=valid[:, None] & (offs_n[None, :] < N))


def _block_m(num_pairs: int, num_experts: int) -> int:
    """Small blocks while pairs per expert are few (decode), larger ones for prefill."""
    per_expert = num_pairs / num_experts
    return 16 if per_expert <= 16 else 32 if per_expert <= 128 else 64


def _expert_gemm(a: torch.Tensor, b: torch.Tensor, layout: PairLayout, num_pairs: int, rows_per_a: int,
                 block_m: int, weights: torch.Tensor | None, scale: torch.Tensor | None = None) -> torch.Tensor:
    """``[num_pairs, N]``: each pair's row of ``a`` times its expert's ``b[e] [N, K]`` (times ``scale[e]``
    per row when quantized) transposed."""
    n, k = b.shape[1], b.shape[2]
    out = a.new_empty(num_pairs, n)
    block_n, block_k = 64, 32
    grid = (layout.block_experts.numel(), triton.cdiv(n, block_n))
    _expert_gemm_kernel[grid](
        a, b, out, weights if weights is not None else out, scale if scale is not None else out,
        layout.sorted_pairs, layout.block_experts, layout.num_padded, n, k, num_pairs, rows_per_a,
        a.stride(0), a.stride(1), b.stride(0), b.stride(1), b.stride(2), out.stride(0), out.stride(1),
        scale.stride(0) if scale is not None else 0,
        MUL_WEIGHT=weights is not None, SCALED=scale is not None, IEEE_FP32=a.dtype == torch.float32,
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k,
    )
    return out


def fused_experts(
    x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor,
    act: Callable[[torch.Tensor], torch.Tensor], gate_up_scale: torch.Tensor | None = None,
    down_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """Same contract as :func:`omnistage.layers.moe_torch.experts_sorted`, all on the device."""
    if not AVAILABLE:
        raise RuntimeError("fused_experts needs Triton (pip install triton)")
    num_tokens, top_k = ids.shape
    num_pairs = num_tokens * top_k
    x = x.contiguous()
    block_m = _block_m(num_pairs, gate_up.shape[0])
    layout = align_pairs(ids, gate_up.shape[0], block_m)
    hidden = _expert_gemm(x, gate_up, layout, num_pairs, top_k, block_m, None, gate_up_scale)
    gate, up = hidden.chunk(2, dim=-1)
    inner = (act(gate) * up).contiguous()
    out = _expert_gemm(inner, down, layout, num_pairs, 1, block_m, weights.flatten().contiguous(), down_scale)
    # The top-k sum in fp32: in bf16 each pair's output is already rounded once.
    return out.view(num_tokens, top_k, -1).sum(dim=1, dtype=torch.float32).to(x.dtype)
