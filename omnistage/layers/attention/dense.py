"""Attention for N sequences in lockstep: each owns a contiguous cache row and all have the same length.

The code predictor's loop is such a batch (every frame adds the same tokens at the same positions), so its
keys and values need no block table: sequence ``i`` writes ``kv_cache[:, i, start:end]`` and reads
``kv_cache[:, i, :end]`` in place, one SDPA call for the batch. Shapes depend only on ``(N, step)``, Python
ints, so the loop is capturable in a CUDA graph.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F

from omnistage.layers.attention.base import AttentionBackend, AttentionMetadata


class LockstepViews(NamedTuple):
    """Where one layer's lockstep pass writes and reads, for ``n`` sequences adding ``new`` tokens each:
    ``k_new``/``v_new`` ``[n, new, Hkv, D]`` (the slots the new keys/values go to), ``keys``/``values``
    ``[n, Hkv, end, D]`` (the whole context, views of the cache) and the causal ``mask`` of the new tokens
    (None for one new token). They depend only on the cache and ``(n, new, end)``, so a loop can keep them."""

    k_new: torch.Tensor
    v_new: torch.Tensor
    keys: torch.Tensor
    values: torch.Tensor
    mask: torch.Tensor | None

    @classmethod
    def of(cls, kv_cache: torch.Tensor, n: int, new: int, end: int) -> LockstepViews:
        start = end - new
        mask = None
        if new > 1:  # the new tokens are the last ``new`` of ``end`` positions
            rows = torch.arange(start, end, device=kv_cache.device)[:, None]
            mask = torch.arange(end, device=kv_cache.device)[None, :] <= rows
        return cls(kv_cache[0, :n, start:end], kv_cache[1, :n, start:end],
                   kv_cache[0, :n, :end].transpose(1, 2), kv_cache[1, :n, :end].transpose(1, 2), mask)


def lockstep_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, views: LockstepViews,
                       scale: float) -> torch.Tensor:
    """Stores ``k``/``v`` ``[n * new, Hkv, D]`` in the cache and attends ``q [n * new, H, D]`` over the context."""
    n, new = views.k_new.shape[:2]
    views.k_new.copy_(k.view(views.k_new.shape))
    views.v_new.copy_(v.view(views.v_new.shape))
    queries = q.view(n, new, *q.shape[1:]).transpose(1, 2)  # [N, H, new, D]
    out = F.scaled_dot_product_attention(queries, views.keys, views.values, attn_mask=views.mask, scale=scale,
                                         enable_gqa=True)
    return out.transpose(1, 2).reshape(n * new, *q.shape[1:])


class LockstepBackend(AttentionBackend):
    """``kv_cache``: ``[2, N_max, L_max, Hkv, D]``; ``meta`` says N, the new tokens per sequence and the context
    length after them (``query_lens[0]``, ``context_lens_cpu[0]``), the same for every sequence."""

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
        if kv_cache is None or sliding_window is not None:
            raise ValueError("lockstep attention needs a cache and full attention")
        views = LockstepViews.of(kv_cache, meta.num_seqs, meta.query_lens[0], meta.context_lens_cpu[0])
        return lockstep_attention(q, k, v, views, scale)
