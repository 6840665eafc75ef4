"""The first step where two greedy runs part, with the reference's top-2 gap there (a near-tie or a real
difference)."""

from __future__ import annotations

import torch

from omnistage.tools.verify.divergence import first_divergence


def _scores(*rows: list[float]) -> list[torch.Tensor]:
    return [torch.tensor(row) for row in rows]


def test_identical_runs_have_no_divergence() -> None:
    assert first_divergence([1, 2, 3], [1, 2, 3], _scores([0.0, 1.0])) is None


def test_the_first_differing_step_with_the_gap_and_margin() -> None:
    scores = _scores([0.0, 2.0, 1.0, 0.0], [0.5, 0.0, 0.25, float("-inf")])
    d = first_divergence([1, 2, 0], [1, 0, 3], scores)
    assert (d.step, d.ours, d.theirs) == (1, 2, 0)
    torch.testing.assert_close(d.top2_gap, 0.25, rtol=0, atol=1e-7)
    torch.testing.assert_close(d.margin, 0.25, rtol=0, atol=1e-7)
    assert "step 1" in d.describe() and "top-2 gap 0.25" in d.describe()


def test_our_pick_masked_by_the_reference_has_an_infinite_margin() -> None:
    d = first_divergence([3], [0], _scores([1.0, 0.0, 0.5, float("-inf")]))
    assert d.margin == float("inf") and d.top2_gap == 0.5


def test_a_run_that_stops_early_differs_where_it_stopped() -> None:
    d = first_divergence([1, 2], [1, 2, 5], _scores([1.0], [1.0], [0.0, 3.0, 1.0, 0.0, 0.0, 2.0]))
    assert (d.step, d.ours, d.theirs, d.margin) == (2, None, 5, None)
    assert "stopped" in d.describe()
    torch.testing.assert_close(d.top2_gap, 1.0, rtol=0, atol=1e-7)


def test_without_scores_only_the_step_is_named() -> None:
    d = first_divergence([4], [5])
    assert d.top2_gap is None and d.describe() == "first differs at step 0: omnistage 4, reference 5"
