"""Block tables stay consecutive when requests grow in turn (CPU decode reads a table run by run), and the
position-first hand-out keeps freeing, prefix hits and eviction correct."""

from __future__ import annotations

import random

import pytest

from omnistage.engine.kv_cache import BlockPool, KVCacheManager
from omnistage.engine.kv_cache.free_runs import FreeRuns
from omnistage.engine.request import Request
from omnistage.layers.attention.paged_cpu import block_runs
from omnistage.sampling_params import SamplingParams


def _req(rid: str, tokens: list[int]) -> Request:
    return Request(rid, tokens, SamplingParams(max_tokens=4))


def _runs(manager: KVCacheManager, rid: str) -> int:
    table = manager.block_ids(rid)
    return len(block_runs(table, 0, len(table) - 1))


def _decode_in_turn(manager: KVCacheManager, reqs: list[Request], steps: int) -> None:
    """What the scheduler does at batch ``len(reqs)``: every request takes one more token per step, in turn."""
    for step in range(steps):
        for req in reqs:
            assert manager.allocate_slots(req, 1) is not None
            req.num_computed_tokens += 1


def _interleaved_batch(num_blocks: int, caching: bool, prompt: int = 16,
                       steps: int = 256) -> tuple[KVCacheManager, list[Request]]:
    """``bench engine``'s pool and pattern: 16 prompts admitted together, then decoded side by side."""
    manager = KVCacheManager(num_blocks=num_blocks, block_size=16, enable_prefix_caching=caching)
    reqs = [_req(f"r{i}", [i * 1000 + t for t in range(prompt)]) for i in range(16)]
    for req in reqs:
        assert manager.allocate_slots(req, prompt) is not None
        req.num_computed_tokens = prompt
    _decode_in_turn(manager, reqs, steps)
    return manager, reqs


@pytest.mark.parametrize("caching", [False, True])
def test_sixteen_requests_growing_in_turn_keep_few_runs(caching: bool) -> None:
    # 17 blocks each in a pool with 8 to spare, as `bench engine --batch 16 --output-len 256` sizes it; handing
    # out blocks in queue order gave every block its own run (17 runs per table).
    manager, _ = _interleaved_batch(16 * 17 + 8, caching)
    runs = [_runs(manager, f"r{i}") for i in range(16)]
    assert all(len(manager.block_ids(f"r{i}")) == 17 for i in range(16))
    assert max(runs) <= 2, runs


def test_roomy_pool_gives_one_run_per_request() -> None:
    manager, _ = _interleaved_batch(16 * 17 * 4 + 1, caching=False)
    assert [_runs(manager, f"r{i}") for i in range(16)] == [1] * 16


def test_freed_blocks_return_and_every_block_can_be_handed_out() -> None:
    manager, reqs = _interleaved_batch(16 * 17 + 8, caching=False)
    for req in reqs:
        manager.free(req)
    pool = manager.pool
    assert pool.num_free_blocks == pool.num_blocks - 1 and all(b.ref_cnt == 0 for b in pool.blocks)
    ids = [b.block_id for b in pool.get_new_blocks(pool.num_blocks - 1)]
    assert sorted(ids) == list(range(1, pool.num_blocks))  # no block lost or handed out twice


def test_prefix_hits_survive_position_first_hand_out_until_needed() -> None:
    manager = KVCacheManager(num_blocks=12, block_size=2)
    a = _req("a", [5, 6, 7, 8, 9])
    manager.allocate_slots(a, 5)
    cached_ids = manager.block_ids("a")[:2]
    manager.free(a)
    filler = _req("x", list(range(50, 58)))  # 4 blocks: uncached free blocks are enough, the cached ones stay
    manager.allocate_slots(filler, 8)
    assert not set(manager.block_ids("x")) & set(cached_ids)
    b = _req("b", [5, 6, 7, 8, 1])
    hits, n = manager.get_computed_blocks(b)
    assert n == 4 and [h.block_id for h in hits] == cached_ids
    assert manager.allocate_slots(b, 1, hits) is not None
    assert manager.block_ids("b")[:2] == cached_ids
    manager.free(b)
    manager.free(filler)
    everything = _req("y", list(range(100, 122)))  # 11 blocks: every free block, so the cached ones are evicted
    assert manager.allocate_slots(everything, 22) is not None
    manager.free(everything)
    assert manager.get_computed_blocks(_req("c", [5, 6, 7, 8, 1]))[1] == 0


def test_reset_prefix_cache_makes_cached_free_blocks_positional() -> None:
    pool = BlockPool(6)
    blocks = pool.get_new_blocks(3)
    for i, block in enumerate(blocks):
        pool.cache_full_block(block, bytes([i]) * 32)
    pool.free_blocks(blocks)
    pool.reset_prefix_cache()
    assert [b.block_id for b in pool.get_new_blocks(5)] == [1, 2, 3, 4, 5]


def test_free_runs_track_the_longest_run_through_random_changes() -> None:
    rng = random.Random(0)
    runs, members = FreeRuns(), set()
    for _ in range(2000):
        block = rng.randrange(1, 64)
        if block in members:
            runs.remove(block)
            members.discard(block)
        else:
            runs.add(block)
            members.add(block)
        best = 0
        for start in members:
            if start - 1 not in members:
                end = start
                while end in members:
                    end += 1
                best = max(best, end - start)
        found = runs.longest()
        assert (0 if found is None else found[1] - found[0]) == best
        assert found is None or all(b in runs for b in range(*found))
    assert len(runs) == len(members)
