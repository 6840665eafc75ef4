"""The batched sampler: greedy, filters, penalties, bans, and per-request seeds."""

from __future__ import annotations

import torch

from omnistage.runner.sampler import SamplingBatch, Sampler, apply_top_k_top_p


def _batch(n: int, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0,
           generators: list[torch.Generator | None] | None = None, **kwargs: object) -> SamplingBatch:
    return SamplingBatch(
        temperature=torch.full((n,), temperature), top_k=torch.full((n,), top_k, dtype=torch.int64),
        top_p=torch.full((n,), top_p), generators=generators or [None] * n,
        all_greedy=temperature == 0, any_greedy=temperature == 0, needs_sort=top_k > 0 or top_p < 1, **kwargs,
    )


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def test_greedy_is_argmax() -> None:
    logits = torch.randn(5, 30)
    assert torch.equal(Sampler().sample(logits, _batch(5, temperature=0.0)), logits.argmax(-1))


def test_top_k_one_and_tiny_top_p_are_greedy() -> None:
    logits = torch.randn(6, 40)
    for batch in (_batch(6, top_k=1), _batch(6, top_p=1e-6)):
        assert torch.equal(Sampler().sample(logits, batch), logits.argmax(-1))


def test_top_k_top_p_keep_per_row_sets() -> None:
    logits = torch.tensor([[4.0, 3.0, 2.0, 1.0], [4.0, 3.0, 2.0, 1.0]])
    out = apply_top_k_top_p(logits, torch.tensor([2, 0]), torch.tensor([1.0, 0.5]))
    kept = torch.isfinite(out)
    assert kept[0].tolist() == [True, True, False, False]
    assert kept[1].tolist() == [True, False, False, False]  # top token alone has > 0.5 of the mass


def test_seeded_rows_ignore_batch_composition() -> None:
    torch.manual_seed(0)
    logits = torch.randn(4, 50)
    sampler = Sampler()
    alone = [sampler.sample(logits[i:i + 1].repeat(1, 1), _batch(1, generators=[_gen(i)])).item()
             for i in range(4) for _ in range(1)]
    gens = [_gen(i) for i in range(4)]
    together = sampler.sample(logits, _batch(4, generators=gens)).tolist()
    assert together == alone
    # The same seeds in reversed rows give the same per-request draws.
    reversed_draws = sampler.sample(logits.flip(0), _batch(4, generators=[_gen(i) for i in (3, 2, 1, 0)]))
    assert reversed_draws.flip(0).tolist() == alone


def test_sampling_follows_the_distribution() -> None:
    logits = torch.log(torch.tensor([[0.7, 0.2, 0.1]])).repeat(4000, 1)
    counts = torch.bincount(Sampler().sample(logits, _batch(4000)), minlength=3).float() / 4000
    assert torch.allclose(counts, torch.tensor([0.7, 0.2, 0.1]), atol=0.03)


def test_repetition_penalty_and_bans() -> None:
    logits = torch.tensor([[2.0, 1.9, -1.0, -1.2]])
    seen = torch.tensor([[True, False, True, False]])
    batch = _batch(1, temperature=0.0, repetition_penalty=torch.tensor([2.0]), seen=seen)
    assert Sampler().sample(logits, batch).item() == 1  # 2.0 / 2 = 1.0 < 1.9
    banned = _batch(1, temperature=0.0, banned=((0, (0, 1)),))
    assert Sampler().sample(logits, banned).item() == 2
    assert Sampler().sample(logits, banned, penalties=False).item() == 0


def test_mixed_greedy_and_random_rows() -> None:
    logits = torch.randn(3, 20)
    batch = _batch(3)
    batch.temperature = torch.tensor([0.0, 1.0, 0.0])
    batch.all_greedy, batch.any_greedy = False, True
    out = Sampler().sample(logits, batch)
    assert out[0] == logits[0].argmax() and out[2] == logits[2].argmax()
