"""OpenAI's presence/frequency penalties and logprobs: batched tensor ops against the formula, and through the
engine (batched requests get what they get alone; logprobs are the raw log-softmax of the chosen token)."""

from __future__ import annotations

import pytest
import torch

from omnistage.engine import Request
from omnistage.runner.sampler import SamplingBatch, Sampler, apply_penalties
from omnistage.sampling_params import SamplingParams
from tests.runner.helpers import make_engine, prompts
from tests.runner.toy_model import ToyLM


def _greedy(n: int, **kwargs: object) -> SamplingBatch:
    return SamplingBatch(temperature=torch.zeros(n), top_k=torch.zeros(n, dtype=torch.int64), top_p=torch.ones(n),
                         generators=[None] * n, all_greedy=True, any_greedy=True, needs_sort=False, **kwargs)


def test_penalties_follow_openai_formula_per_row() -> None:
    logits = torch.randn(3, 8)
    counts = torch.zeros(3, 8)
    counts[0, 1], counts[0, 2], counts[1, 1], counts[2, 5] = 3, 1, 2, 4
    presence, frequency = torch.tensor([0.5, 0.0, -1.0]), torch.tensor([0.25, 2.0, 0.0])
    out = apply_penalties(logits, _greedy(3, presence_penalty=presence, frequency_penalty=frequency, counts=counts))
    expected = logits.clone()
    for r in range(3):
        for t in range(8):
            c = counts[r, t].item()
            expected[r, t] -= frequency[r].item() * c + presence[r].item() * (c > 0)
    torch.testing.assert_close(out, expected, rtol=0, atol=1e-6)
    assert not torch.equal(out, logits) and torch.equal(logits, logits.clone())  # the input is left alone


def test_logprobs_only_for_rows_that_ask_and_from_raw_logits() -> None:
    logits = torch.randn(4, 50)
    counts = torch.zeros(4, 50)
    counts[:, logits[1].argmax()] = 5  # a penalty moves row 1's choice; its logprobs stay the raw ones
    batch = _greedy(4, logprob_rows=(1, 3), max_logprobs=3, presence_penalty=torch.full((4,), 2.0),
                    frequency_penalty=torch.full((4,), 2.0), counts=counts)
    out = Sampler().sample_checked(logits, batch)
    assert out.logprobs is not None and out.logprobs.rows == (1, 3)
    raw = logits.log_softmax(-1)
    for i, row in enumerate((1, 3)):
        token = out.token_ids[row]
        torch.testing.assert_close(out.logprobs.sampled[i], raw[row, token], rtol=0, atol=1e-6)
        best = raw[row].topk(3)
        assert out.logprobs.top_ids[i].tolist() == best.indices.tolist()
        torch.testing.assert_close(out.logprobs.top_logprobs[i], best.values, rtol=0, atol=1e-6)
    assert out.token_ids[1] != logits[1].argmax()


def _run(model: ToyLM, requests: list[Request]) -> dict[str, list]:
    engine = make_engine(model)
    for request in requests:
        engine.add_request(request)
    got: dict[str, list] = {}
    for out in engine.run_until_done():
        got.setdefault(out.request_id, []).extend(zip(out.new_token_ids, out.logprobs or [None]))
    return got


@pytest.fixture(scope="module")
def model() -> ToyLM:
    return ToyLM()


def test_frequency_penalty_breaks_loops_and_batching_changes_nothing(model: ToyLM) -> None:
    ids = prompts(97, [5, 11])
    plain = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
    penalised = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True, frequency_penalty=2.0,
                               presence_penalty=2.0, logprobs=2)
    alone = {name: _run(model, [Request(name, ids[i], p)])[name]
             for name, i, p in (("a", 0, plain), ("b", 0, penalised), ("c", 1, penalised))}
    together = _run(model, [Request("a", ids[0], plain), Request("b", ids[0], penalised),
                            Request("c", ids[1], penalised)])
    assert {k: [t for t, _ in v] for k, v in together.items()} == {k: [t for t, _ in v] for k, v in alone.items()}
    plain_tokens = [t for t, _ in alone["a"]]
    assert len(set(plain_tokens)) < len(plain_tokens)  # the toy model loops when left alone
    assert [t for t, _ in alone["b"]] != plain_tokens
    for (token, lp), (_, lp_alone) in zip(together["b"], alone["b"]):
        assert lp.token_id == token and len(lp.top) == 2
        torch.testing.assert_close(torch.tensor(lp.logprob), torch.tensor(lp_alone.logprob), rtol=0, atol=1e-5)
    assert all(lp is None for _, lp in together["a"])  # a request that did not ask gets none


def test_penalty_ranges_are_openai_ranges() -> None:
    for bad in ({"presence_penalty": 2.01}, {"frequency_penalty": -2.5}, {"logprobs": 21},
                {"presence_penalty": float("nan")}):
        with pytest.raises(ValueError):
            SamplingParams(**bad)
    SamplingParams(presence_penalty=-2.0, frequency_penalty=2.0, logprobs=0)
