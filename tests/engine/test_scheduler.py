"""Scheduler: admission under the token budget, chunked prefill, preemption, aborts, stop rules."""

from __future__ import annotations

import random

import pytest

from omnistage.engine.request import FinishReason, RequestStatus
from tests.engine.factories import EOS, FakeRunner, make_request, make_scheduler, step


def _leak_free(scheduler) -> bool:
    pool = scheduler.kv.pool
    return pool.num_free_blocks == pool.num_blocks - 1 and all(b.ref_cnt == 0 for b in pool.blocks)


def test_admits_in_order_within_budget_and_seq_limit() -> None:
    sched = make_scheduler(max_num_batched_tokens=16, max_num_seqs=2)
    for i in range(3):
        sched.add_request(make_request(f"r{i}", prompt_len=6, first_token=100 * i))
    out = sched.schedule()
    assert [(e.request.request_id, e.num_new_tokens) for e in out.scheduled] == [("r0", 6), ("r1", 6)]
    assert out.num_tokens == 12 and all(e.reset for e in out.scheduled)
    assert [r.request_id for r in sched.waiting] == ["r2"]


def test_long_prompt_is_chunked_and_decodes_join_the_same_step() -> None:
    sched = make_scheduler(max_num_batched_tokens=8)
    runner = FakeRunner(sched.kv.pool.num_blocks)
    sched.add_request(make_request("short", prompt_len=3))
    step(sched, runner)
    sched.add_request(make_request("long", prompt_len=20))
    plans = [[(e.request.request_id, e.num_new_tokens) for e in step(sched, runner).scheduled] for _ in range(3)]
    # The decode token goes first; the long prompt takes the rest of the budget, chunk by chunk.
    assert plans == [[("short", 1), ("long", 7)], [("short", 1), ("long", 7)], [("short", 1), ("long", 6)]]
    long_req = sched.requests["long"]
    assert long_req.num_computed_tokens == 20 and long_req.num_output_tokens == 1


def test_long_prefill_threshold_caps_one_request_chunk() -> None:
    sched = make_scheduler(max_num_batched_tokens=64, long_prefill_token_threshold=5)
    sched.add_request(make_request("a", prompt_len=12))
    sched.add_request(make_request("b", prompt_len=3))
    out = sched.schedule()
    assert [e.num_new_tokens for e in out.scheduled] == [5, 3]
    assert not out.scheduled[0].samples and out.scheduled[1].samples


def test_preempts_latest_when_blocks_run_out_then_recomputes() -> None:
    # 6 usable blocks of 4 tokens; two requests of 8 prompt tokens fill 4, decoding needs more.
    sched = make_scheduler(num_blocks=7, max_num_batched_tokens=64)
    runner = FakeRunner(7)
    sched.add_request(make_request("old", prompt_len=8, max_tokens=12))
    sched.add_request(make_request("new", prompt_len=8, max_tokens=12))
    preempted = []
    for _ in range(40):
        if not sched.has_unfinished_requests():
            break
        out = step(sched, runner)
        preempted += out.preempted_req_ids
    assert not sched.has_unfinished_requests()
    assert preempted and set(preempted) == {"new"}
    assert _leak_free(sched)


def test_preempted_request_resumes_with_reset_and_full_recompute() -> None:
    sched = make_scheduler(num_blocks=5, max_num_batched_tokens=64, enable_prefix_caching=False)
    runner = FakeRunner(5)
    sched.add_request(make_request("a", prompt_len=7, max_tokens=20))
    sched.add_request(make_request("b", prompt_len=7, max_tokens=20, first_token=50))
    while True:
        out = step(sched, runner)
        if out.preempted_req_ids:
            break
    victim = sched.requests[out.preempted_req_ids[0]]
    assert victim.status is RequestStatus.PREEMPTED and victim.num_computed_tokens == 0
    assert sched.kv.block_ids(victim.request_id) == []
    while True:
        out = sched.schedule()
        entry = next((e for e in out.scheduled if e.request is victim), None)
        if entry is not None:
            break
        sched.update_from_output(out, runner.execute_model(out))
    # Prompt and every generated token are recomputed in one go, then the next token is sampled.
    assert entry.reset and entry.num_new_tokens == victim.num_tokens and entry.samples
    assert victim.num_output_tokens > 0


def test_single_request_larger_than_cache_stops_instead_of_looping() -> None:
    sched = make_scheduler(num_blocks=3, max_num_batched_tokens=64)  # 8 token slots in all
    runner = FakeRunner(3)
    request = make_request("a", prompt_len=6, max_tokens=50)
    sched.add_request(request)
    for _ in range(20):
        step(sched, runner)
    assert not sched.has_unfinished_requests()
    assert request.finish_reason is FinishReason.LENGTH and request.num_computed_tokens == 8
    assert _leak_free(sched)


def test_prompt_that_can_never_fit_is_rejected() -> None:
    sched = make_scheduler(num_blocks=3)
    with pytest.raises(ValueError):
        sched.add_request(make_request("huge", prompt_len=40))
    with pytest.raises(ValueError):
        sched.add_request(make_request("dup"))
        sched.add_request(make_request("dup"))


def test_abort_frees_blocks_everywhere() -> None:
    sched = make_scheduler()
    runner = FakeRunner(sched.kv.pool.num_blocks)
    for i in range(3):
        sched.add_request(make_request(f"r{i}", prompt_len=9))
    step(sched, runner)
    sched.add_request(make_request("w"))
    for rid in ("r1", "w", "missing"):
        sched.abort_request(rid)
    assert sched.requests.keys() == {"r0", "r2"}
    assert sched.schedule().finished_req_ids == ["r1", "w"]
    sched.abort_request("r0")
    sched.abort_request("r2")
    assert _leak_free(sched)


def test_stop_rules() -> None:
    sched = make_scheduler()
    tokens = {"eos": [5, EOS], "stop": [77], "len": [5, 5, 5], "ign": [EOS, EOS], "min": [EOS, EOS]}
    sched.add_request(make_request("eos", max_tokens=10))
    sched.add_request(make_request("stop", max_tokens=10, stop_token_ids=[77]))
    sched.add_request(make_request("len", max_tokens=3))
    sched.add_request(make_request("ign", max_tokens=2, ignore_eos=True))
    sched.add_request(make_request("min", max_tokens=5, min_tokens=2))
    runner = FakeRunner(sched.kv.pool.num_blocks, next_token=lambda r: tokens[r.request_id][r.num_output_tokens])
    finished = {}
    while sched.has_unfinished_requests():
        out = sched.schedule()
        for o in sched.update_from_output(out, runner.execute_model(out)):
            if o.finished:
                finished[o.request_id] = o.finish_reason
    assert finished == {"eos": FinishReason.STOP, "stop": FinishReason.STOP, "len": FinishReason.LENGTH,
                        "ign": FinishReason.LENGTH, "min": FinishReason.STOP}



def test_no_max_tokens_runs_until_the_context_is_full() -> None:
    sched = make_scheduler(max_model_len=12)
    sched.add_request(make_request("open", prompt_len=5, max_tokens=None, ignore_eos=True))
    runner = FakeRunner(sched.kv.pool.num_blocks)
    outputs = []
    while sched.has_unfinished_requests():
        out = sched.schedule()
        outputs += sched.update_from_output(out, runner.execute_model(out))
    assert len(outputs) == 7 and outputs[-1].finish_reason is FinishReason.LENGTH

def test_not_ready_request_keeps_blocks_and_is_skipped() -> None:
    sched = make_scheduler()
    runner = FakeRunner(sched.kv.pool.num_blocks)
    held: set[str] = set()
    sched.is_ready = lambda r: r.request_id not in held
    sched.add_request(make_request("a"))
    sched.add_request(make_request("b", first_token=50))
    step(sched, runner)
    held.add("b")
    out = step(sched, runner)
    assert [e.request.request_id for e in out.scheduled] == ["a"]
    assert sched.kv.block_ids("b")
    held.clear()
    assert [e.request.request_id for e in step(sched, runner).scheduled] == ["a", "b"]


def test_not_ready_waiting_request_keeps_its_place_without_blocking_others() -> None:
    sched = make_scheduler()
    sched.is_ready = lambda r: r.request_id != "first"
    for rid, tok in (("first", 0), ("second", 50), ("third", 90)):
        sched.add_request(make_request(rid, first_token=tok))
    assert [e.request.request_id for e in sched.schedule().scheduled] == ["second", "third"]
    assert [r.request_id for r in sched.waiting] == ["first"]


def test_prefix_cache_hit_skips_shared_prompt_blocks() -> None:
    sched = make_scheduler()
    runner = FakeRunner(sched.kv.pool.num_blocks)
    sched.add_request(make_request("a", prompt_len=10))
    step(sched, runner)
    sched.add_request(make_request("b", prompt_len=10))
    out = step(sched, runner)
    entry = next(e for e in out.scheduled if e.request.request_id == "b")
    assert entry.request.num_cached_tokens == 8 and entry.num_new_tokens == 2


@pytest.mark.parametrize("seed", [0, 1])
def test_no_block_leaked_after_random_add_abort_finish(seed: int) -> None:
    rng = random.Random(seed)
    sched = make_scheduler(num_blocks=24, max_num_seqs=6, max_num_batched_tokens=32,
                           long_prefill_token_threshold=rng.choice([0, 7]))
    runner = FakeRunner(24)
    next_id = 0
    for _ in range(1000):
        action = rng.random()
        if action < 0.3:
            sched.add_request(make_request(f"q{next_id}", prompt_len=rng.randint(1, 30),
                                           max_tokens=rng.randint(1, 12), first_token=rng.randint(0, 3) * 4))
            next_id += 1
        elif action < 0.4 and sched.requests:
            sched.abort_request(rng.choice(sorted(sched.requests)))
        else:
            step(sched, runner)
        used = {b for r in sched.running for b in sched.kv.block_ids(r.request_id)}  # prefixes are shared
        assert len(used) + sched.kv.num_free_blocks <= sched.kv.usable_blocks
        assert all(not sched.kv.block_ids(r.request_id) for r in sched.waiting)
    while sched.has_unfinished_requests():
        step(sched, runner)
    assert _leak_free(sched)
