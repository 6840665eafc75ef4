"""Paged-attention test cases: random sequences laid into a paged cache, and the dense attention they must give."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from omnistage.layers.attention.base import AttentionMetadata


@dataclass
class PagedCase:
    q: torch.Tensor  # [T, H, D] new queries, sequences end to end
    k: torch.Tensor  # [T, Hkv, D] new keys
    v: torch.Tensor
    kv_cache: torch.Tensor  # [2, blocks, page, Hkv, D], cached prefixes already written
    meta: AttentionMetadata
    dense_k: list[torch.Tensor]  # per sequence, its whole context [L, Hkv, D]
    dense_v: list[torch.Tensor]


def make_case(seqs: list[tuple[int, int]], page: int, heads: int = 4, kv_heads: int = 2, head_dim: int = 16,
              seed: int = 0, num_blocks: int = 64) -> PagedCase:
    """``seqs``: (context length after the step, new tokens) per sequence. Blocks are handed out shuffled, so
    tables mix contiguous runs and jumps; block 0 stays the null block."""
    gen = torch.Generator().manual_seed(seed)
    cache = torch.zeros(2, num_blocks, page, kv_heads, head_dim)
    free = (torch.randperm(num_blocks - 1, generator=gen) + 1).tolist()
    free[2:6] = sorted(free[2:6])  # some consecutive-looking stretches too
    width = max(math.ceil(ctx / page) for ctx, _ in seqs)
    tables = torch.zeros(len(seqs), width, dtype=torch.int32)
    qs, ks, vs, slots, dense_k, dense_v = [], [], [], [], [], []
    for i, (ctx, new) in enumerate(seqs):
        blocks = [free.pop() for _ in range(math.ceil(ctx / page))]
        tables[i, :len(blocks)] = torch.tensor(blocks, dtype=torch.int32)
        k_all = torch.randn(ctx, kv_heads, head_dim, generator=gen)
        v_all = torch.randn(ctx, kv_heads, head_dim, generator=gen)
        for pos in range(ctx):
            slot = blocks[pos // page] * page + pos % page
            if pos < ctx - new:
                cache[0].view(-1, kv_heads, head_dim)[slot] = k_all[pos]
                cache[1].view(-1, kv_heads, head_dim)[slot] = v_all[pos]
            else:
                slots.append(slot)
        qs.append(torch.randn(new, heads, head_dim, generator=gen))
        ks.append(k_all[ctx - new:])
        vs.append(v_all[ctx - new:])
        dense_k.append(k_all)
        dense_v.append(v_all)
    starts = [0]
    for _, new in seqs:
        starts.append(starts[-1] + new)
    meta = AttentionMetadata(
        query_start_loc=torch.tensor(starts, dtype=torch.int32),
        context_lens=torch.tensor([ctx for ctx, _ in seqs], dtype=torch.int32),
        slot_mapping=torch.tensor(slots, dtype=torch.int64), block_tables=tables,
        query_lens=[new for _, new in seqs], context_lens_cpu=[ctx for ctx, _ in seqs],
    )
    return PagedCase(torch.cat(qs), torch.cat(ks), torch.cat(vs), cache, meta, dense_k, dense_v)


def dense_attention(case: PagedCase, scale: float, window: int | None = None) -> torch.Tensor:
    """Each sequence's new queries over its whole context, causal (and windowed), in float64."""
    outs = []
    start = 0
    for i, new in enumerate(case.meta.query_lens):
        ctx = case.meta.context_lens_cpu[i]
        q = case.q[start:start + new].double()
        group = q.shape[1] // case.dense_k[i].shape[1]
        k = case.dense_k[i].double().repeat_interleave(group, dim=1)
        v = case.dense_v[i].double().repeat_interleave(group, dim=1)
        scores = torch.einsum("qhd,khd->hqk", q, k) * scale
        q_pos = torch.arange(ctx - new, ctx)[:, None]
        k_pos = torch.arange(ctx)[None, :]
        keep = k_pos <= q_pos
        if window is not None:
            keep &= k_pos > q_pos - window
        probs = torch.softmax(scores.masked_fill(~keep, float("-inf")), dim=-1)
        outs.append(torch.einsum("hqk,khd->qhd", probs, v))
        start += new
    return torch.cat(outs).float()
