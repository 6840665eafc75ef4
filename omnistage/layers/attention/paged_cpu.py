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
    q: torch.Tensor, kv_cache: torch.Tensor, table: list[int], context_len: int, scale: float,
    window: int | None = None,
) -> torch.Tensor:
    """One query ``[H, D]`` (the sequence's last position) over its cached context → ``[H, D]``."""
    block_size, num_kv_heads, head_dim = kv_cache.shape[2], kv_cache.shape[3], kv_cache.shape[4]
    first_pos = 0 if window is None else max(0, context_len - window)
    runs = block_runs(table, first_pos // block_size, (context_len - 1) // block_size)
    qg = q.view(num_kv_heads, -1, head_dim)  # [Hkv, G, D]: the G query heads that share each KV head
    values, scores = [], []
    for block, count, index in runs:
        lo = max(first_pos - index * block_size, 0)
        hi = min(context_len - index * block_size, count * block_size)
        k = kv_cache[0, block:block + count].flatten(0, 1)[lo:hi]  # [L, Hkv, D], a view
        v = kv_cache[1, block:block + count].flatten(0, 1)[lo:hi]
        values.append(v)
        scores.append(torch.matmul(qg, k.permute(1, 2, 0)))  # [Hkv, G, L]
    joined = scores[0] if len(scores) == 1 else torch.cat(scores, dim=-1)
    probs = torch.softmax(joined.mul_(scale), dim=-1, dtype=torch.float32).to(q.dtype)
    out, start = None, 0
    for v in values:
        part = torch.matmul(probs[..., start:start + v.shape[0]], v.transpose(0, 1))  # [Hkv, G, D]
        out = part if out is None else out.add_(part)
        start += v.shape[0]
    return out.view(-1, head_dim)
