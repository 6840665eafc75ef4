"""The AR runner on a toy paged-attention model: batching never changes what a request gets."""

from __future__ import annotations

import pytest
import torch

from omnistage.engine import Request
from omnistage.sampling_params import SamplingParams
from tests.runner.helpers import GREEDY, config, generate, make_engine, prompts, requests
from tests.runner.toy_model import ToyLM

LENGTHS = [3, 9, 17, 1, 30, 6]


@pytest.fixture(scope="module")
def model() -> ToyLM:
    return ToyLM()


def _alone(model: ToyLM, token_lists: list[list[int]], params: SamplingParams = GREEDY) -> dict[str, list[int]]:
    return {f"r{i}": generate(model, [Request("solo", ids, params)])["solo"] for i, ids in enumerate(token_lists)}


@pytest.mark.parametrize("cfg", [
    config(),
    config(max_num_batched_tokens=16, long_prefill_token_threshold=8),  # chunked prefill next to decodes
    config(num_blocks=20, enable_prefix_caching=False),  # blocks run short: preemption and recompute
], ids=["plain", "chunked", "preempting"])
def test_batched_greedy_equals_alone(model: ToyLM, cfg) -> None:
    token_lists = prompts(97, LENGTHS)
    alone = _alone(model, token_lists)
    engine = make_engine(model, cfg)
    batch = requests(token_lists)
    for request in batch:
        engine.add_request(request)
    outputs = engine.run_until_done()
    batched: dict[str, list[int]] = {}
    for out in outputs:
        batched.setdefault(out.request_id, []).extend(out.new_token_ids)
    assert batched == alone
    if cfg.num_blocks == 20:
        assert sum(r.num_preemptions for r in batch) > 0
    assert engine.scheduler.kv.num_free_blocks == cfg.num_blocks - 1
    engine.step()  # hands the last finished ids to the runner
    assert not engine.runner.batch.rows and not engine.runner.batch.generators


def test_prefix_cache_gives_same_tokens(model: ToyLM) -> None:
    system = prompts(97, [13])[0]
    token_lists = [system + tail for tail in prompts(97, [2, 5, 1], seed=3)]
    cached = make_engine(model)
    outs = {}
    for request in requests(token_lists):  # one at a time, so later ones hit the earlier blocks
        cached.add_request(request)
        for out in cached.run_until_done():
            outs.setdefault(out.request_id, []).extend(out.new_token_ids)
    assert outs == generate(model, requests(token_lists), config(enable_prefix_caching=False))
    assert cached.scheduler.kv.pool.usage == 0.0


def test_embedding_prompt_equals_id_prompt(model: ToyLM) -> None:
    ids = prompts(97, [11])[0]
    embeds = model.embed_tokens(torch.tensor(ids))
    mixed = [Request("ids", ids, GREEDY), Request("emb", None, GREEDY, prompt_embeds=embeds),
             Request("other", prompts(97, [5], seed=9)[0], GREEDY)]
    out = generate(model, mixed, config(max_num_batched_tokens=8, max_num_seqs=4))
    assert out["ids"] == out["emb"]


def test_seeded_sampling_ignores_batch_company(model: ToyLM) -> None:
    params = SamplingParams(temperature=1.0, top_k=20, top_p=0.9, seed=1234, max_tokens=10, ignore_eos=True)
    target = prompts(97, [7])[0]
    alone = generate(model, [Request("t", target, params)])["t"]
    noisy = SamplingParams(temperature=1.5, max_tokens=6, ignore_eos=True)
    crowd = [Request("t", target, params)] + requests(prompts(97, [4, 12], seed=5), noisy)
    assert generate(model, crowd, config(max_num_batched_tokens=10, max_num_seqs=4))["t"] == alone


def test_repetition_penalty_and_min_tokens(model: ToyLM) -> None:
    ids = prompts(97, [5])[0]
    plain = generate(model, [Request("p", ids, GREEDY)])["p"]
    assert len(set(plain)) < len(plain)  # the toy model loops when left alone
    params = SamplingParams(temperature=0.0, repetition_penalty=50.0, max_tokens=12, ignore_eos=True)
    penalised = generate(model, [Request("q", ids, params)])["q"]
    assert len(set(penalised)) == len(penalised) and not set(penalised) & set(ids)
    eos = plain[0]
    gated = SamplingParams(temperature=0.0, max_tokens=12, min_tokens=3)
    out = generate(model, [Request("m", ids, gated, eos_token_id=eos)])["m"]
    assert eos not in out[:3]


class _Recorder(ToyLM):
    def __init__(self) -> None:
        super().__init__(mrope=True)
        self.seen: list[torch.Tensor] = []

    def forward(self, input_ids, positions, inputs_embeds=None):  # type: ignore[override]
        self.seen.append(positions.clone())
        return super().forward(input_ids, positions, inputs_embeds)


def test_mrope_positions_follow_prompt_then_rope_delta() -> None:
    model = _Recorder()
    prompt_pos = torch.tensor([[0, 1, 2, 2, 2, 3], [0, 1, 2, 3, 3, 3], [0, 1, 2, 2, 3, 3]])
    request = Request("m", [5, 6, 7, 8, 9, 10], SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True),
                      prompt_positions=prompt_pos, rope_delta=-2)
    generate(model, [request], config(max_num_batched_tokens=4, max_num_seqs=4))
    assert torch.equal(torch.cat(model.seen[:2], dim=1), prompt_pos)  # chunked 4 + 2
    assert [p[:, 0].tolist() for p in model.seen[2:]] == [[4, 4, 4], [5, 5, 5]]  # 6 - 2, 7 - 2


def test_abort_mid_generation_frees_blocks_and_runner_rows(model: ToyLM) -> None:
    engine = make_engine(model)
    params = SamplingParams(temperature=0.7, seed=5, max_tokens=50, ignore_eos=True)
    for request in requests(prompts(97, [10, 4, 7]), params):
        engine.add_request(request)
    for _ in range(3):
        engine.step()
    assert len(engine.runner.batch.rows) == 3 and len(engine.runner.batch.generators) == 3
    assert engine.abort_request("r1")
    engine.step()
    assert set(engine.runner.batch.rows) == {"r0", "r2"} and "r1" not in engine.runner.batch.generators
    engine.abort_request("r0")
    engine.abort_request("r2")
    engine.step()
    assert not engine.runner.batch.rows and engine.scheduler.kv.pool.usage == 0.0
