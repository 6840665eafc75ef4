"""Decode attention that reads the paged KV cache in place (CPU): no gather of the context into a new tensor.

A sequence's blocks are read as *runs*: maximal stretches of consecutive block
ids in its block table, each a plain view of the cache
(``kv_cache[0, first:first + n]`` flattened to ``[n * block_size, Hkv, D]``).
Scores of the query against each run are matmuls on those views; only the
scores (``H x context`` numbers, not ``context x Hkv x D``) are joined before
the softmax, and the output sums each run's probabilities times its values.
A freshly prefilled sequence is one run; decode steps that interleave
allocations split it into a few. A sliding window reads only the blocks that
overlap it. A cache stored in another dtype than the queries (bf16 KV under an fp32 model) is read run by run
into the queries' dtype: the matmuls and softmax stay in the model's precision.
"""

from __future__ import annotations

from typing import NamedTuple

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


class CacheViews(NamedTuple):
    """One layer's cache as flat views made once per forward: keys ``[Hkv, D, slots]``, values ``[Hkv, slots, D]``
    (slot = block * page + offset), so each run of a sequence is one slice of each."""

    keys_t: torch.Tensor
    values: torch.Tensor
    page: int

    def keys(self, start: int, end: int, dtype: torch.dtype) -> torch.Tensor:
        return self.keys_t[:, :, start:end].to(dtype)

    def vals(self, start: int, end: int, dtype: torch.dtype) -> torch.Tensor:
        return self.values[:, start:end].to(dtype)

    @classmethod
    def of(cls, kv_cache: torch.Tensor) -> CacheViews:
        blocks, page, num_kv_heads, head_dim = kv_cache.shape[1:]
        flat = kv_cache.view(2, blocks * page, num_kv_heads, head_dim)
        return cls(flat[0].permute(1, 2, 0), flat[1].transpose(0, 1), page)


def decode_in_place(
    q: torch.Tensor, cache: CacheViews, table: list[int], context_len: int, window: int | None, out: torch.Tensor
) -> None:
    """One query ``[Hkv, G, D]`` (already scaled; the sequence's last position) over its cached context, written
    into ``out [Hkv, G, D]``. A handful of torch calls per run: it runs once per sequence and layer."""
    page = cache.page
    first_pos = 0 if window is None else max(0, context_len - window)
    runs = block_runs(table, first_pos // page, (context_len - 1) // page)
    spans, scores = [], []
    for block, count, index in runs:
        start = block * page + max(first_pos - index * page, 0)
        end = block * page + min(context_len - index * page, count * page)
        spans.append((start, end))
        scores.append(torch.bmm(q, cache.keys(start, end, q.dtype)))  # [Hkv, G, L]
    probs = torch.softmax(scores[0] if len(scores) == 1 else torch.cat(scores, dim=-1), dim=-1)
    if len(spans) == 1:
        torch.bmm(probs, cache.vals(*spans[0], q.dtype), out=out)
        return
    offset = 0
    for i, (start, end) in enumerate(spans):
        part = probs[..., offset:offset + end - start]
        if i == 0:
            torch.bmm(part, cache.vals(start, end, q.dtype), out=out)
        else:
            out.baddbmm_(part, cache.vals(start, end, q.dtype))
        offset += end - start
