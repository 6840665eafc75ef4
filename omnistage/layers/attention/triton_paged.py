"""Paged attention on GPU in one Triton kernel: decode, prefill and mixed batches, KV read in place.

Each program takes one sequence, one tile of its new queries and one KV head;
its rows are the tile's query positions times the query heads sharing that KV
head (GQA), so each key/value block is loaded once for the whole group. It
walks the sequence's block table, one cache block per iteration, with an online
softmax (running max and sum, rescaled as blocks arrive), masking keys past the
context, after the query (causal) or outside the sliding window; blocks wholly
outside the window or after the tile's last query are never loaded. The grid
depends only on the batch's sequence count and longest query, never on context
lengths (read from device tensors), so decode steps capture in CUDA graphs.

Keys/values are stored first with fixed-shape ops (padding rows go to the null
block). Tested on CPU under ``TRITON_INTERPRET=1`` against the torch backend.
"""

from __future__ import annotations

import torch

from omnistage.layers.attention.base import AttentionBackend, AttentionMetadata
from omnistage.layers.attention.torch_sdpa import TorchSDPABackend
from omnistage.layers.attention.torch_sdpa_cuda import store_kv_unchecked

try:
    import triton
    import triton.language as tl
except ImportError:
    triton = None

AVAILABLE = triton is not None


if AVAILABLE:

    @triton.jit
    def _paged_attention_kernel(
        q_ptr, k_cache_ptr, v_cache_ptr, out_ptr, query_start_ptr, context_lens_ptr, block_tables_ptr,
        scale, window,
        stride_qt, stride_qh, stride_kb, stride_kt, stride_kh, stride_ot, stride_oh, stride_bt,
        GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_M: tl.constexpr,
        HEAD_DIM: tl.constexpr, D_PAD: tl.constexpr, PAGE: tl.constexpr, WINDOWED: tl.constexpr,
        IEEE_FP32: tl.constexpr,
    ):
        seq = tl.program_id(0)
        tile = tl.program_id(1)
        kv_head = tl.program_id(2)
        q_start = tl.load(query_start_ptr + seq)
        q_len = tl.load(query_start_ptr + seq + 1) - q_start
        if tile * BLOCK_Q >= q_len:
            return
        context = tl.load(context_lens_ptr + seq)
        prefix = context - q_len  # tokens cached before this step's queries

        rows = tl.arange(0, BLOCK_M)
        q_idx = tile * BLOCK_Q + rows // GROUP_PAD
        group = rows % GROUP_PAD
        row_ok = (rows // GROUP_PAD < BLOCK_Q) & (q_idx < q_len) & (group < GROUP)
        head = kv_head * GROUP + group
        dims = tl.arange(0, D_PAD)
        dim_ok = dims < HEAD_DIM
        q_ptrs = q_ptr + (q_start + q_idx).to(tl.int64)[:, None] * stride_qt + head[:, None] * stride_qh + dims[None, :]
        q = tl.load(q_ptrs, mask=row_ok[:, None] & dim_ok[None, :], other=0.0)
        q_pos = prefix + q_idx

        m_i = tl.full((BLOCK_M,), float("-inf"), dtype=tl.float32)
        l_i = tl.full((BLOCK_M,), 0.0, dtype=tl.float32)
        acc = tl.full((BLOCK_M, D_PAD), 0.0, dtype=tl.float32)
        last_pos = tl.minimum(prefix + (tile + 1) * BLOCK_Q, context)  # one past the tile's last query
        first_block = 0
        if WINDOWED:
            first_block = tl.maximum(prefix + tile * BLOCK_Q - window + 1, 0) // PAGE
        offs = tl.arange(0, PAGE)
        for j in range(first_block, (last_pos + PAGE - 1) // PAGE):
            block = tl.load(block_tables_ptr + seq * stride_bt + j).to(tl.int64)
            kv_off = block * stride_kb + offs[:, None] * stride_kt + kv_head * stride_kh + dims[None, :]
            k = tl.load(k_cache_ptr + kv_off, mask=dim_ok[None, :], other=0.0)
            v = tl.load(v_cache_ptr + kv_off, mask=dim_ok[None, :], other=0.0)
            if IEEE_FP32:  # fp32 models: no TF32 rounding of q.k
                scores = tl.dot(q, tl.trans(k), input_precision="ieee") * scale
            else:
                scores = tl.dot(q, tl.trans(k)).to(tl.float32) * scale
            k_pos = j * PAGE + offs
            keep = row_ok[:, None] & (k_pos[None, :] <= q_pos[:, None]) & (k_pos[None, :] < context)
            if WINDOWED:
                keep = keep & (k_pos[None, :] > q_pos[:, None] - window)
            scores = tl.where(keep, scores, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(scores, axis=1))
            m_safe = tl.where(m_new > float("-inf"), m_new, 0.0)  # rows with nothing seen yet stay at zero
            p = tl.exp(scores - m_safe[:, None])
            alpha = tl.exp(m_i - m_safe)
            l_i = l_i * alpha + tl.sum(p, axis=1)
            if IEEE_FP32:
                acc = acc * alpha[:, None] + tl.dot(p, v, input_precision="ieee")
            else:
                acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v).to(tl.float32)
            m_i = m_new
        out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
        o_ptrs = out_ptr + (q_start + q_idx).to(tl.int64)[:, None] * stride_ot + head[:, None] * stride_oh + dims[None, :]
        tl.store(o_ptrs, out.to(out_ptr.dtype.element_ty), mask=row_ok[:, None] & dim_ok[None, :])


def _pow2(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


def paged_attention(
    q: torch.Tensor, kv_cache: torch.Tensor, meta: AttentionMetadata, scale: float, sliding_window: int | None
) -> torch.Tensor:
    """q ``[T, H, D]`` over each sequence's cached context (new keys/values already stored) → ``[T, H, D]``."""
    num_kv_heads, head_dim, page = kv_cache.shape[3], kv_cache.shape[4], kv_cache.shape[2]
    if page & (page - 1):
        raise ValueError(f"the Triton paged kernel needs a power-of-two block size, got {page}")
    if q.stride(-1) != 1:  # the kernel walks head dims with unit stride
        q = q.contiguous()
    group = q.shape[1] // num_kv_heads
    group_pad = _pow2(group)
    max_q = max(meta.query_lens)
    block_q = 1 if max_q == 1 else max(1, 64 // group_pad)
    block_m = max(16, block_q * group_pad)  # tl.dot wants at least 16 rows
    out = torch.empty_like(q)
    grid = (meta.num_seqs, -(-max_q // block_q), num_kv_heads)
    k_cache, v_cache = kv_cache[0], kv_cache[1]
    _paged_attention_kernel[grid](
        q, k_cache, v_cache, out, meta.query_start_loc, meta.context_lens, meta.block_tables,
        scale, sliding_window or 0,
        q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        out.stride(0), out.stride(1), meta.block_tables.stride(0),
        GROUP=group, GROUP_PAD=group_pad, BLOCK_Q=block_q, BLOCK_M=block_m, HEAD_DIM=head_dim,
        D_PAD=max(16, _pow2(head_dim)), PAGE=page, WINDOWED=sliding_window is not None,
        IEEE_FP32=q.dtype == torch.float32,
    )
    return out


class TritonPagedBackend(AttentionBackend):
    """The CUDA backend when Triton is present: every step through :func:`paged_attention`."""

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        kv_cache: torch.Tensor | None,
        meta: AttentionMetadata,
        scale: float,
        sliding_window: int | None = None,
    ) -> torch.Tensor:
        if kv_cache is None:  # no cache to page through (a whole prompt in one pass): plain SDPA
            return TorchSDPABackend().forward(q, k, v, None, meta, scale, sliding_window)
        store_kv_unchecked(kv_cache, k, v, meta.slot_mapping)
        return paged_attention(q, kv_cache, meta, scale, sliding_window)
