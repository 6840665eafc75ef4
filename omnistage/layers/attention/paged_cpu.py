"""Decode attention that reads the paged KV cache in place (CPU): no gather of the context into a new tensor.

A sequence's blocks are read as *runs*: maximal stretches of consecutive block
ids in its block table, each a plain view of the cache
(``kv_cache[0, first:first + n]`` flattened to ``[n * block_size, Hkv, D]``).
Scores of the query against each run are matmuls on those views; only the
scores (``H x context`` numbers, not ``context x Hkv x D``) are joined before
the softmax, and the output sums each run's probabilities times its values.
A freshly prefilled sequence is one run; decode steps that interleave
allocations split it into a few. A sliding window reads only the blocks that
overlap it.
"""

from __future__ import annotations

import torch


def block_runs(table: list[int], first: int, last: int) -> list[tuple[int, int, int]]:
    """Runs over table entries ``first..last`` (inclusive): ``(first block id, blocks, table index)``."""
    runs: list[tuple[int, int, int]] = []
    start = first
    for i in range(first + 1, last + 2):
        if i > last or table[i] != table[i - 1] + 1:
            runs.append((table[start], i - start, start))
            start = i
    return runs


def decode_in_place(
    q: torch.Tensor, kv_cache: torch.Tensor, table: list[int], context_len: int, window: int | None,
    out: torch.Tensor,
) -> None:
    """One query ``[H, D]`` (already scaled; the sequence's last position) over its cached context, written
    into ``out [H, D]``. Kept to a few torch calls per run: it runs once per sequence and layer."""
    page, num_kv_heads, head_dim = kv_cache.shape[2], kv_cache.shape[3], kv_cache.shape[4]
    first_pos = 0 if window is None else max(0, context_len - window)
    runs = block_runs(table, first_pos // page, (context_len - 1) // page)
    qg = q.view(num_kv_heads, -1, head_dim)  # [Hkv, G, D]: the G query heads that share each KV head
    keys, values = kv_cache[0], kv_cache[1]
    spans, scores = [], []
    for block, count, index in runs:
        lo = max(first_pos - index * page, 0)
        hi = min(context_len - index * page, count * page)
        k = keys[block:block + count].view(count * page, num_kv_heads, head_dim)[lo:hi]  # a view
        spans.append((block, count, lo, hi))
        scores.append(torch.bmm(qg, k.permute(1, 2, 0)))  # [Hkv, G, L]
    probs = torch.softmax(scores[0] if len(scores) == 1 else torch.cat(scores, dim=-1), dim=-1)
    target = out.view(num_kv_heads, -1, head_dim)
    start = 0
    for i, (block, count, lo, hi) in enumerate(spans):
        v = values[block:block + count].view(count * page, num_kv_heads, head_dim)[lo:hi].transpose(0, 1)
        part = probs[..., start:start + hi - lo] if len(spans) > 1 else probs
        if i == 0:
            torch.bmm(part, v, out=target)
        else:
            target.baddbmm_(part, v)
        start += hi - lo
