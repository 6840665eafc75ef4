"""``SequenceCache`` writes each step in place in buffers with room to spare: what it returns is always the
concatenation of everything appended, across growth, and a copy's writes never reach the cache it was copied
from or its other copies."""

from __future__ import annotations

import torch

from omnistage.models.sequence_cache import SequenceCache


def _appended(parts: list[torch.Tensor]) -> torch.Tensor:
    return torch.cat(parts, dim=2)


def test_views_are_everything_appended_across_growth():
    gen = torch.Generator().manual_seed(0)
    cache, keys, values = SequenceCache(), [[], []], [[], []]
    for step in range(150):  # a 70-position prompt, then single positions past two doublings
        n = 70 if step == 0 else 1
        for layer in range(2):
            k, v = torch.randn(1, 2, n, 4, generator=gen), torch.randn(1, 2, n, 4, generator=gen)
            keys[layer].append(k)
            values[layer].append(v)
            got_k, got_v = cache.extend(layer, k, v)
            assert torch.equal(got_k, _appended(keys[layer])) and torch.equal(got_v, _appended(values[layer]))
    assert cache.length == 219


def test_copies_extend_apart():
    base = SequenceCache()
    prefix = torch.randn(1, 2, 5, 4)
    base.extend(0, prefix, prefix)
    first, second = base.copy(), base.copy()
    ones, zeros = torch.ones(1, 2, 1, 4), torch.zeros(1, 2, 1, 4)
    first.extend(0, ones, ones)
    got, _ = second.extend(0, zeros, zeros)
    assert torch.equal(got, torch.cat([prefix, zeros], dim=2))
    got, _ = base.extend(0, 2 * ones, 2 * ones)
    assert torch.equal(got, torch.cat([prefix, 2 * ones], dim=2))
    assert torch.equal(first.extend(0, zeros, zeros)[0], torch.cat([prefix, ones, zeros], dim=2))
