"""The top-k-only fast path (``topk`` instead of a vocabulary sort) masks exactly as the sort path does."""

from __future__ import annotations

import torch

from omnistage.runner.sampler import Sampler, SamplingBatch, apply_top_k, apply_top_k_top_p


def test_top_k_fast_path_equals_sort_path() -> None:
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(6, 300, generator=gen)
    logits[2, :5] = logits[2, 5]  # ties at the k-th value survive on both paths
    top_k = torch.tensor([50, 0, 6, 1, 300, 7])
    fast = apply_top_k(logits, top_k, max_k=300)
    slow = apply_top_k_top_p(logits, top_k, torch.ones(6))
    assert torch.equal(torch.isinf(fast), torch.isinf(slow))
    assert torch.equal(fast[~torch.isinf(fast)], logits[~torch.isinf(fast)])
    assert not torch.isinf(fast[1]).any() and (~torch.isinf(fast[3])).sum() == 1


def test_sampler_uses_fast_path_with_same_seeded_draws() -> None:
    logits = torch.randn(4, 200, generator=torch.Generator().manual_seed(1))

    def batch(**extra) -> SamplingBatch:
        gens = [torch.Generator().manual_seed(i) for i in range(4)]
        return SamplingBatch(temperature=torch.full((4,), 0.9), top_k=torch.tensor([50, 10, 0, 3]),
                             top_p=torch.ones(4), generators=gens, all_greedy=False, any_greedy=False,
                             needs_sort=True, **extra)

    slow = Sampler().sample(logits, batch())
    fast = Sampler().sample(logits, batch(max_top_k=50, any_top_p=False))
    assert torch.equal(slow, fast)
