"""Paged attention with torch ops (CPU and any device).

Keys/values of new tokens are scattered into the paged cache by slot. Then,
on a CPU, every decode row (one new token) of the step goes to the C kernel in
one call (:mod:`omnistage.layers.attention.native`, reading the cache in
place); where it cannot be built, per sequence, a decode row reads its context
in place through its block table (:mod:`omnistage.layers.attention.paged_cpu`, no copy); a
fresh prompt attends among its own new keys/values (nothing to read back);
only a prefill continuing a cached prefix (chunked prefill, prefix-cache hit)
gathers its context and runs one masked SDPA call. On a GPU (the code
predictor's private cache) decode-only steps stay one padded, gathered call.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from omnistage.layers.attention.base import AttentionBackend, AttentionMetadata
from omnistage.layers.attention.native import paged_decode
from omnistage.layers.attention.paged_cpu import CacheViews, decode_in_place


def store_kv(kv_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    """Writes each new token's key/value at its flat slot; rows with slot -1 are skipped."""
    num_blocks, block_size = kv_cache.shape[1], kv_cache.shape[2]
    flat = kv_cache.view(2, num_blocks * block_size, *kv_cache.shape[3:])
    valid = slot_mapping >= 0
    if not bool(valid.all()):
        slot_mapping, k, v = slot_mapping[valid], k[valid], v[valid]
    # A cache of another dtype (bf16 or fp8 KV under an fp32 model on a CPU) stores the keys and values rounded;
    # torch's CPU index_copy_ has no fp8 kernel, so fp8 is copied as its bytes.
    k, v = k.to(flat.dtype), v.to(flat.dtype)
    if flat.element_size() == 1:
        flat, k, v = flat.view(torch.uint8), k.view(torch.uint8), v.view(torch.uint8)
    flat[0].index_copy_(0, slot_mapping, k)
    flat[1].index_copy_(0, slot_mapping, v)


def gather_context(kv_cache: torch.Tensor, block_table: torch.Tensor, length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """One sequence's keys and values ``[length, Hkv, D]`` read through its block table."""
    block_size = kv_cache.shape[2]
    n_blocks = -(-length // block_size)
    blocks = block_table[:n_blocks].long()
    k = kv_cache[0].index_select(0, blocks).flatten(0, 1)[:length]
    v = kv_cache[1].index_select(0, blocks).flatten(0, 1)[:length]
    return k, v


def _causal_mask(q_len: int, kv_len: int, window: int | None, device: torch.device) -> torch.Tensor | None:
    """Boolean mask (True = attend) for queries that are the last ``q_len`` of ``kv_len`` positions."""
    if q_len == 1 and window is None:
        return None
    q_pos = torch.arange(kv_len - q_len, kv_len, device=device)[:, None]
    k_pos = torch.arange(kv_len, device=device)[None, :]
    mask = k_pos <= q_pos
    if window is not None:
        mask &= k_pos > q_pos - window
    return mask


class TorchSDPABackend(AttentionBackend):
    def __init__(self, native: bool = True) -> None:
        """``native``: decode rows on a CPU go to the C kernel (:mod:`omnistage.layers.attention.native`) when it
        builds; False keeps them on torch ops."""
        self.native = native

    def _kernel(self, q: torch.Tensor, kv_cache: torch.Tensor, meta: AttentionMetadata):  # noqa: ANN202
        """The C decode kernel where it serves this call (CPU, float32 queries, a float32, bf16 or fp8 cache), else
        None."""
        from omnistage.layers.attention import native

        tables, lens = meta.block_tables, meta.context_lens
        if not self.native or q.device.type != "cpu" or q.dtype != torch.float32 or tables is None \
                or kv_cache.dtype not in native.CACHE_KINDS or not kv_cache.is_contiguous() \
                or tables.dtype != torch.int32 or tables.stride(-1) != 1 or lens.dtype != torch.int32 \
                or not lens.is_contiguous():
            return None
        return native.load()

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
        if kv_cache is not None and q.is_cuda and meta.is_decode_only and sliding_window is None:
            # On a GPU a per-sequence loop costs launches, not bytes: one padded call (the code predictor's
            # private cache runs here; engine stages get the Triton paged kernel).
            store_kv(kv_cache, k, v, meta.slot_mapping)
            return self._decode(q, kv_cache, meta, scale)
        out = torch.empty_like(q)
        lib = None
        if kv_cache is not None:
            store_kv(kv_cache, k, v, meta.slot_mapping)
            grouped = (kv_cache.shape[3], -1, q.shape[-1])  # [Hkv, G, D] per row
            scaled = (q * scale).view(q.shape[0], *grouped)  # once for all decode rows
            out_grouped = out.view(q.shape[0], *grouped)
            lib = self._kernel(q, kv_cache, meta)
            if lib is None:  # decode rows one by one, below
                tables, cache = meta.block_table_rows(), CacheViews.of(kv_cache)
            elif 1 in meta.query_lens:  # every decode row in one call
                seqs, rows = meta.decode_index()
                paged_decode(lib, scaled, kv_cache, meta.block_tables, meta.context_lens, seqs, rows,
                             sliding_window, max(meta.context_lens_cpu), out_grouped)
        start = 0
        for i, q_len in enumerate(meta.query_lens):
            end = start + q_len
            ctx_len = meta.context_lens_cpu[i]
            if kv_cache is not None and q_len == 1:
                if lib is None:
                    decode_in_place(scaled[start], cache, tables[i], ctx_len, sliding_window, out_grouped[start])
            else:
                if kv_cache is None or q_len == ctx_len:  # nothing cached before these tokens
                    ks, vs = k[start:end], v[start:end]
                else:
                    ks, vs = gather_context(kv_cache, meta.block_tables[i], ctx_len)
                    ks, vs = ks.to(q.dtype), vs.to(q.dtype)
                mask = _causal_mask(q_len, ks.shape[0], sliding_window, q.device)
                out[start:end] = _sdpa(q[start:end], ks, vs, mask, scale)
            start = end
        return out

    @staticmethod
    def _decode(q: torch.Tensor, kv_cache: torch.Tensor, meta: AttentionMetadata, scale: float) -> torch.Tensor:
        """All sequences have one query: gather padded contexts and run one SDPA call (fixed shapes, for CUDA
        graphs without a paged kernel: the gather is the price of capturing torch ops)."""
        max_len = max(meta.context_lens_cpu)
        block_size = kv_cache.shape[2]
        n_blocks = -(-max_len // block_size)
        tables = meta.block_tables[:, :n_blocks].long()  # [N, nb]
        k = kv_cache[0][tables].flatten(1, 2)[:, :max_len]  # [N, L, Hkv, D]
        v = kv_cache[1][tables].flatten(1, 2)[:, :max_len]
        positions = torch.arange(max_len, device=q.device)[None, :]
        mask = (positions < meta.context_lens[:, None].to(q.device))[:, None, None, :]  # [N,1,1,L]
        qh = q[:, None].transpose(1, 2)  # [N, H, 1, D]
        kh, vh = k.transpose(1, 2), v.transpose(1, 2)
        out = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=mask, scale=scale, enable_gqa=True)
        return out.transpose(1, 2)[:, 0]


def _sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, scale: float) -> torch.Tensor:
    """q [Lq,H,D], k/v [Lk,Hkv,D] → [Lq,H,D], grouped-query heads broadcast."""
    out = F.scaled_dot_product_attention(
        q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None],
        attn_mask=mask, scale=scale, enable_gqa=True,
    )
    return out[0].transpose(0, 1)
