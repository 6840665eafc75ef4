"""The top-k-only fast path (``topk`` instead of a vocabulary sort) masks exactly as the sort path does."""

from __future__ import annotations

import torch

from omnistage.runner.sampler import Sampler, SamplingBatch, apply_top_k_top_p, apply_top_k_top_p_within


def test_top_k_fast_path_equals_sort_path() -> None:
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(6, 300, generator=gen)
    logits[2, :5] = logits[2, 5]  # ties at the k-th value survive on both paths
    top_k = torch.tensor([50, 0, 6, 1, 300, 7])
    fast = apply_top_k_top_p_within(logits, top_k, None, max_k=300)
    slow = apply_top_k_top_p(logits, top_k, torch.ones(6))
    assert torch.equal(torch.isinf(fast), torch.isinf(slow))
    assert torch.equal(fast[~torch.isinf(fast)], logits[~torch.isinf(fast)])
    assert not torch.isinf(fast[1]).any() and (~torch.isinf(fast[3])).sum() == 1


def test_top_k_top_p_within_the_top_k_masks_as_the_sort_does() -> None:
    """Nucleus and top-k found from one ``topk`` keep exactly the tokens the vocabulary sort keeps (random
    logits: no ties), for small and large k, tight and loose p, and a row with top-p off; ties with the k-th
    logit survive on both."""
    gen = torch.Generator().manual_seed(3)
    logits = torch.randn(7, 1000, generator=gen) * 3
    top_k = torch.tensor([40, 40, 1, 1000, 200, 5, 40])
    top_p = torch.tensor([0.8, 0.05, 0.9, 0.5, 0.99, 1.0, 0.3])
    fast = apply_top_k_top_p_within(logits, top_k, top_p, max_k=1000)
    slow = apply_top_k_top_p(logits, top_k, top_p)
    assert torch.equal(torch.isinf(fast), torch.isinf(slow))
    assert torch.equal(fast[~torch.isinf(fast)], logits[~torch.isinf(fast)])
    kept = (~torch.isinf(fast)).sum(dim=-1)
    assert kept[5] == 5 and kept[2] == 1 and 1 < kept[0] < 40 and kept[1] < kept[0]  # p and k both bite
    tied = logits[:1].clone()
    tied[0, tied[0].topk(41).indices[-1]] = tied[0].topk(40).values[-1]  # the 41st ties the 40th
    one = torch.tensor([40])
    assert (~torch.isinf(apply_top_k_top_p_within(tied, one, torch.ones(1), max_k=40))).sum() == 41
    assert (~torch.isinf(apply_top_k_top_p(tied, one, torch.ones(1)))).sum() == 41


def test_sampler_uses_fast_path_with_same_seeded_draws() -> None:
    logits = torch.randn(4, 200, generator=torch.Generator().manual_seed(1))

    def batch(**extra) -> SamplingBatch:
        settings = {"top_k": torch.tensor([50, 10, 0, 3]), "top_p": torch.ones(4), **extra}
        gens = [torch.Generator().manual_seed(i) for i in range(4)]
        return SamplingBatch(temperature=torch.full((4,), 0.9), generators=gens, all_greedy=False,
                             any_greedy=False, needs_sort=True, **settings)

    slow = Sampler().sample(logits, batch())
    fast = Sampler().sample(logits, batch(max_top_k=50, any_top_p=False))
    assert torch.equal(slow, fast)
    nucleus = {"top_k": torch.tensor([50, 10, 7, 3]), "top_p": torch.tensor([0.9, 0.5, 1.0, 0.7])}
    slow = Sampler().sample(logits, batch(**nucleus))
    within = Sampler().sample(logits, batch(**nucleus, max_top_k=50, any_top_p=True, all_top_k=True))
    assert torch.equal(slow, within)  # the same seeded draws over the vocabulary, the same masks


def _residual_batch(n: int, top_k: list[int], temperature: list[float], top_p: float = 1.0) -> SamplingBatch:
    greedy = [t == 0 for t in temperature]
    return SamplingBatch(temperature=torch.tensor(temperature), top_k=torch.tensor(top_k),
                         top_p=torch.full((n,), top_p), generators=[torch.Generator().manual_seed(i) for i in range(n)],
                         all_greedy=all(greedy), any_greedy=any(greedy), needs_sort=True, max_top_k=max(top_k),
                         any_top_p=top_p < 1.0, all_top_k=all(k > 0 for k, g in zip(top_k, greedy) if not g))


def test_residual_noise_covers_the_largest_top_k_only_when_every_sampled_row_has_one() -> None:
    steps, vocab = 3, 500
    narrow = Sampler().residual(_residual_batch(3, [50, 7, 0], [0.9, 0.9, 0.0]), steps, vocab, torch.device("cpu"))
    assert narrow.noise is not None and narrow.noise.shape == (steps, 3, 50)  # the greedy row's 0 does not count
    for batch, whole in ((_residual_batch(2, [50, 0], [0.9, 0.9]), False),  # a row samples the whole vocabulary
                         (_residual_batch(2, [50, 7], [0.9, 0.9], top_p=0.8), False),  # top-p needs the sort
                         (_residual_batch(2, [50, 7], [0.9, 0.9]), True)):  # a captured graph's fixed buffer
        noise = Sampler().residual(batch, steps, vocab, torch.device("cpu"), whole_vocab=whole).noise
        assert noise is not None and noise.shape == (steps, 2, vocab)


def test_top_k_race_samples_each_rows_top_k_distribution() -> None:
    """Against the whole-vocabulary race on the same logits: both follow each row's renormalised top k."""
    draws, vocab = 6000, 40
    logits = torch.randn(vocab, generator=torch.Generator().manual_seed(4)) * 2
    top_k = [5, 12]
    rows = len(top_k)
    batch = _residual_batch(rows, top_k, [0.8, 1.3])
    sampler = Sampler()
    narrow = sampler.residual(batch, draws, vocab, torch.device("cpu"))
    whole = sampler.residual(batch, draws, vocab, torch.device("cpu"), whole_vocab=True)
    assert narrow.noise is not None and narrow.noise.shape[-1] == 12
    many = logits.expand(rows, vocab)
    got = torch.stack([narrow.sample(many, step) for step in range(draws)])  # [draws, rows]
    ref = torch.stack([whole.sample(many, step) for step in range(draws)])
    for row, (k, temp) in enumerate(zip(top_k, [0.8, 1.3])):
        keep = logits.topk(k).indices
        assert torch.isin(got[:, row], keep).all()  # never outside the row's own top k
        expected = torch.zeros(vocab)
        expected[keep] = (logits[keep] / temp).softmax(dim=-1)
        for sample in (got[:, row], ref[:, row]):
            freq = torch.bincount(sample, minlength=vocab).float() / draws
            torch.testing.assert_close(freq, expected, atol=0.025, rtol=0)  # ~4 standard errors at p = 0.5


def test_top_k_race_greedy_rows_take_the_best_logit() -> None:
    logits = torch.randn(3, 300, generator=torch.Generator().manual_seed(2))
    residual = Sampler().residual(_residual_batch(3, [50, 0, 20], [0.9, 0.0, 1.0]), 1, 300, torch.device("cpu"))
    assert residual.noise is not None and residual.noise.shape[-1] == 50
    codes = residual.sample(logits, 0)
    assert codes[1] == logits[1].argmax()
    assert codes[0] in logits[0].topk(50).indices and codes[2] in logits[2].topk(20).indices
