"""Attention for N sequences in lockstep: each owns a contiguous cache row and all have the same length.

The code predictor's loop is such a batch (every frame adds the same tokens at the same positions), so its
keys and values need no block table: sequence ``i`` writes ``kv_cache[:, i, start:end]`` and reads
``kv_cache[:, i, :end]`` in place, one SDPA call for the batch. Shapes depend only on ``(N, step)``, Python
ints, so the loop is capturable in a CUDA graph.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from omnistage.layers.attention.base import AttentionBackend, AttentionMetadata


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
        n, new, end = meta.num_seqs, meta.query_lens[0], meta.context_lens_cpu[0]
        start = end - new
        kv_cache[0, :n, start:end] = k.view(n, new, *k.shape[1:])
        kv_cache[1, :n, start:end] = v.view(n, new, *v.shape[1:])
        keys = kv_cache[0, :n, :end].transpose(1, 2)  # [N, Hkv, end, D], a view
        values = kv_cache[1, :n, :end].transpose(1, 2)
        queries = q.view(n, new, *q.shape[1:]).transpose(1, 2)  # [N, H, new, D]
        mask = None
        if new > 1:  # the new tokens are the last ``new`` of ``end`` positions
            rows = torch.arange(start, end, device=q.device)[:, None]
            mask = torch.arange(end, device=q.device)[None, :] <= rows
        out = F.scaled_dot_product_attention(queries, keys, values, attn_mask=mask, scale=scale, enable_gqa=True)
        return out.transpose(1, 2).reshape(n * new, *q.shape[1:])
