"""Block pool and KV-cache manager: allocation, ref counts, prefix hits, LRU eviction."""

from __future__ import annotations

import pytest
import torch

from omnistage.engine.kv_cache import BlockPool, KVCacheManager
from omnistage.engine.kv_cache.manager import hash_block
from omnistage.engine.request import MultimodalSpan, Request
from omnistage.sampling_params import SamplingParams


def _req(rid: str, tokens: list[int], **kwargs: object) -> Request:
    return Request(rid, tokens, SamplingParams(max_tokens=4), **kwargs)


def _all_free(manager: KVCacheManager) -> bool:
    pool = manager.pool
    return pool.num_free_blocks == pool.num_blocks - 1 and all(b.ref_cnt == 0 for b in pool.blocks)


def test_pool_reserves_null_block_and_counts_refs() -> None:
    pool = BlockPool(5)
    assert pool.num_free_blocks == 4
    blocks = pool.get_new_blocks(4)
    assert 0 not in [b.block_id for b in blocks]
    with pytest.raises(ValueError):
        pool.get_new_blocks(1)
    pool.touch(blocks[:1])
    pool.free_blocks(blocks)
    assert pool.num_free_blocks == 3  # the touched block still holds a reference
    pool.free_blocks(blocks[:1])
    assert pool.num_free_blocks == 4
    with pytest.raises(RuntimeError):
        pool.free_blocks(blocks[:1])


def test_allocate_grows_by_blocks_and_refuses_when_full() -> None:
    manager = KVCacheManager(num_blocks=4, block_size=4)
    req = _req("a", list(range(5)))
    assert len(manager.allocate_slots(req, 5)) == 2
    req.num_computed_tokens = 5
    assert manager.allocate_slots(req, 3) == []  # fits in the partial block
    req.num_computed_tokens = 8
    assert len(manager.allocate_slots(req, 1)) == 1
    req.num_computed_tokens = 9
    assert manager.allocate_slots(req, 4) is None  # would need a 4th usable block
    assert manager.block_ids("a") == [1, 2, 3]
    manager.free(req)
    assert _all_free(manager)


def test_refused_admission_leaves_no_state() -> None:
    manager = KVCacheManager(num_blocks=3, block_size=4)
    req = _req("big", list(range(20)))
    assert manager.allocate_slots(req, 20) is None
    assert manager.block_ids("big") == []
    manager.free(req)
    assert _all_free(manager)


def test_prefix_hits_share_full_blocks_and_keep_last_token() -> None:
    manager = KVCacheManager(num_blocks=16, block_size=4)
    shared = list(range(100, 108))  # two full blocks
    first = _req("a", shared + [1, 2])
    assert manager.get_computed_blocks(first) == ([], 0)
    manager.allocate_slots(first, first.num_tokens)
    second = _req("b", shared + [7])
    hits, n = manager.get_computed_blocks(second)
    assert n == 8 and [b.block_id for b in hits] == manager.block_ids("a")[:2]
    manager.allocate_slots(second, 1, hits)
    assert manager.block_ids("b")[:2] == manager.block_ids("a")[:2]
    assert all(b.ref_cnt == 2 for b in hits)
    exact = _req("c", shared)  # whole prompt cached: the last block is recomputed for its logits
    assert manager.get_computed_blocks(exact)[1] == 4
    manager.free(first)
    manager.free(second)
    assert _all_free(manager)


@pytest.mark.parametrize("keys_outputs", [True, False])
def test_generated_blocks_join_the_index_unless_the_request_keys_its_prompt_only(keys_outputs: bool) -> None:
    """``keys_outputs`` False: a stage whose per-slot state beside the KV is written for prompt rows only
    (Qwen2.5-Omni's thinker) never lets a later prompt hit a block of generated rows."""
    manager = KVCacheManager(num_blocks=16, block_size=4)
    a = _req("a", [1, 2, 3, 4, 5, 6], keys_outputs=keys_outputs)
    manager.allocate_slots(a, a.num_tokens)
    for token in (7, 8, 9):  # generated: the second block fills with rows the prompt did not have
        a.output_token_ids.append(token)
        a.num_computed_tokens = a.num_tokens - 1
        manager.allocate_slots(a, 1)
    later = _req("b", [1, 2, 3, 4, 5, 6, 7, 8, 0])
    assert manager.get_computed_blocks(later)[1] == (8 if keys_outputs else 4)


def test_freed_cached_blocks_revive_until_evicted() -> None:
    manager = KVCacheManager(num_blocks=4, block_size=2)
    a = _req("a", [5, 6, 7, 8, 9])
    manager.allocate_slots(a, 5)
    manager.free(a)
    b = _req("b", [5, 6, 7, 8, 1])
    hits, n = manager.get_computed_blocks(b)
    assert n == 4
    assert manager.allocate_slots(b, 1, hits) is not None
    manager.free(b)
    filler = _req("x", list(range(50, 56)))  # takes every block: the cached ones are evicted
    manager.allocate_slots(filler, 6)
    manager.free(filler)
    assert manager.get_computed_blocks(_req("c", [5, 6, 7, 8, 1]))[1] == 0


def test_embedding_prompts_are_never_shared() -> None:
    manager = KVCacheManager(num_blocks=8, block_size=2)
    req = _req("e", [1, 2, 3, 4, 5], prompt_embeds=torch.zeros(5, 3))
    manager.allocate_slots(req, 5)
    other = _req("f", [1, 2, 3, 4, 5], prompt_embeds=torch.ones(5, 3))
    assert manager.get_computed_blocks(other) == ([], 0)


AUDIO_A, AUDIO_B = bytes(range(32)), bytes(range(1, 33))  # two items' content digests


def _mm_req(rid: str, digest: bytes, start: int = 5, end: int = 11) -> Request:
    """16 ids (4 blocks of 4) with one audio item over positions [start, end), fed as embeddings."""
    ids = [7] * 5 + [99] * 6 + [8] * 5  # 99: the placeholder id, equal whatever the audio
    return _req(rid, ids, prompt_embeds=torch.zeros(16, 3), mm_spans=(MultimodalSpan(start, end, digest),))


def test_block_hashes_cover_the_multimodal_items_in_them() -> None:
    manager = KVCacheManager(num_blocks=16, block_size=4)
    a, same, other = _mm_req("a", AUDIO_A), _mm_req("s", AUDIO_A), _mm_req("o", AUDIO_B)
    for req in (a, same, other):
        manager.get_computed_blocks(req)  # hashes its 3 leading full blocks
    assert a.block_hashes == same.block_hashes and len(a.block_hashes) == 3
    assert a.block_hashes[0] == other.block_hashes[0]  # positions 0-3: before the audio
    # Blocks 1 and 2 hold the audio's rows; any later block differs through the chain.
    assert all(x != y for x, y in zip(a.block_hashes[1:], other.block_hashes[1:]))
    moved = _mm_req("m", AUDIO_A, start=6)  # same content, other placement
    manager.get_computed_blocks(moved)
    assert moved.block_hashes[1] != a.block_hashes[1]
    assert hash_block(None, [1, 2]) != hash_block(None, [1, 2], [MultimodalSpan(0, 2, AUDIO_A)])


def test_multimodal_prompts_hit_only_with_the_same_items() -> None:
    manager = KVCacheManager(num_blocks=16, block_size=4)
    a = _mm_req("a", AUDIO_A)
    manager.allocate_slots(a, a.num_tokens)
    hits, n = manager.get_computed_blocks(_mm_req("s", AUDIO_A))
    assert n == 12 and [b.block_id for b in hits] == manager.block_ids("a")[:3]
    assert manager.get_computed_blocks(_mm_req("o", AUDIO_B))[1] == 4  # only the text block before the audio
    unkeyed = _req("u", [7] * 5 + [99] * 6 + [8] * 5, prompt_embeds=torch.zeros(16, 3))  # e.g. talker states
    assert not unkeyed.prefix_cacheable and manager.get_computed_blocks(unkeyed) == ([], 0)
    with pytest.raises(ValueError):
        MultimodalSpan(3, 3, AUDIO_A)


def test_no_caching_when_disabled() -> None:
    manager = KVCacheManager(num_blocks=8, block_size=2, enable_prefix_caching=False)
    a = _req("a", [1, 2, 3, 4, 5])
    manager.allocate_slots(a, 5)
    assert manager.get_computed_blocks(_req("b", [1, 2, 3, 4, 6])) == ([], 0)
