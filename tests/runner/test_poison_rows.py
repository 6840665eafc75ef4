"""One request's sampling settings never break its batch: out-of-range values are refused where they enter,
and a row whose logits go non-finite anyway fails that request alone while its batch goes on."""

from __future__ import annotations

import msgspec
import pytest
import torch

from omnistage.engine import FinishReason, Request
from omnistage.engine.scheduler import NON_FINITE
from omnistage.runner.sampler import SamplingBatch, Sampler
from omnistage.sampling_params import SamplingParams
from tests.runner.helpers import GREEDY, generate, make_engine, prompts
from tests.runner.toy_model import ToyLM


def _batch(temperature: list[float]) -> SamplingBatch:
    t = torch.tensor(temperature)
    n = len(temperature)
    return SamplingBatch(temperature=t, top_k=torch.zeros(n, dtype=torch.int64), top_p=torch.ones(n),
                         generators=[None] * n, all_greedy=bool((t == 0).all()), any_greedy=bool((t == 0).any()),
                         needs_sort=False)


def test_sampler_flags_only_the_unusable_rows() -> None:
    logits = torch.randn(6, 40)
    logits[1, 3] = float("nan")
    logits[2, 7] = float("inf")
    logits[3] = float("-inf")  # nothing left to pick
    logits[4, 5] = float("-inf")  # one banned token: fine
    for temperature in ([0.0] * 6, [1.0] * 6, [0.0, 1.0, 0.0, 1.0, 0.0, 1.0]):
        out = Sampler().sample_checked(logits.clone(), _batch(temperature))
        assert out.bad.tolist() == [False, True, True, True, False, False], temperature
        assert out.token_ids[1:4].tolist() == [0, 0, 0]  # placeholders, never a NaN's index
        if temperature[0] == 0.0:
            assert out.token_ids[0] == logits[0].argmax()


def test_a_temperature_that_overflows_is_flagged() -> None:
    logits = torch.randn(3, 40)
    out = Sampler().sample_checked(logits, _batch([1.0, 1e-45, 0.0]))
    assert out.bad.tolist() == [False, True, False]
    assert out.token_ids[2] == logits[2].argmax()


@pytest.mark.parametrize("field", ["temperature", "top_k", "repetition_penalty", "seed"])
def test_engine_sampling_params_refuse_batch_breaking_values(field: str) -> None:
    bad = {"temperature": float("inf"), "top_k": 10**23, "repetition_penalty": 1e300, "seed": 2**64}[field]
    with pytest.raises(ValueError, match=field):
        SamplingParams(**{field: bad})


@pytest.mark.parametrize(("field", "value"), [("temperature", 1e-45), ("repetition_penalty", float("nan"))])
def test_a_poisoned_request_fails_alone_and_its_batch_completes(field: str, value: float) -> None:
    """Forced past validation (as a bug elsewhere could), the request's logits go non-finite: the engine
    ends it with an error naming why, and every other request in the same steps gets the tokens it gets
    alone."""
    model = ToyLM()
    token_lists = prompts(97, [5, 9, 3, 12])
    params = SamplingParams(temperature=1.0, max_tokens=12, ignore_eos=True, repetition_penalty=1.5)
    msgspec.structs.force_setattr(params, field, value)
    engine = make_engine(model)
    batch = [Request(f"r{i}", ids, params if i == 1 else GREEDY) for i, ids in enumerate(token_lists)]
    for request in batch:
        engine.add_request(request)
    outputs = engine.run_until_done()
    poisoned = [o for o in outputs if o.request_id == "r1"]
    assert len(poisoned) == 1 and poisoned[0].finished and poisoned[0].finish_reason is FinishReason.ERROR
    assert poisoned[0].error == NON_FINITE and poisoned[0].new_token_ids == []
    kv = engine.scheduler.kv
    assert not engine.has_unfinished_requests() and kv.num_free_blocks == kv.usable_blocks
    for i in (0, 2, 3):
        got = [t for o in outputs if o.request_id == f"r{i}" for t in o.new_token_ids]
        assert got == generate(model, [Request("solo", token_lists[i], GREEDY)])["solo"]
