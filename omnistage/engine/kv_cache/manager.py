"""Per-request block tables on top of the block pool, with prefix-cache lookups.

The scheduler asks two questions: which leading blocks of a new request are
already cached (``get_computed_blocks``), and can the request's next
``num_new_tokens`` get slots (``allocate_slots``; None means "no room, preempt
someone"). Blocks are cached (hashed) as soon as they are allocated for tokens
that fill them: those tokens are known, and their KV is written in the same
forward pass, before any later request can read it.

A block's hash chains its parent's, its token ids, and (vLLM's "extra keys")
the start and content digest of each multimodal item overlapping it: the
placeholder ids of two different audios are equal, their KV is not. Hashes
are SHA-256, so a crafted prompt cannot collide with another user's prefix.
"""

from __future__ import annotations

import hashlib
from array import array
from collections.abc import Sequence

from omnistage.engine.kv_cache.block_pool import BlockPool, KVBlock
from omnistage.engine.request import MultimodalSpan, Request


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


_NO_PARENT = bytes(32)


def hash_block(parent: bytes | None, token_ids: list[int], mm_spans: Sequence[MultimodalSpan] = ()) -> bytes:
    # Fixed-width fields, so no two different inputs serialise to the same bytes.
    h = hashlib.sha256(parent or _NO_PARENT)
    h.update(len(token_ids).to_bytes(4, "little") + len(mm_spans).to_bytes(4, "little"))
    h.update(array("q", token_ids).tobytes())
    for span in mm_spans:
        h.update(span.start.to_bytes(8, "little", signed=True))
        h.update(span.content_hash)
    return h.digest()


class KVCacheManager:
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True) -> None:
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.pool = BlockPool(num_blocks, enable_caching=enable_prefix_caching)
        self._req_blocks: dict[str, list[KVBlock]] = {}
        # How many of a request's leading blocks are registered in the prefix index.
        self._num_cached_blocks: dict[str, int] = {}

    @property
    def num_free_blocks(self) -> int:
        return self.pool.num_free_blocks

    @property
    def usable_blocks(self) -> int:
        return self.pool.num_blocks - 1

    def block_ids(self, request_id: str) -> list[int]:
        return [b.block_id for b in self._req_blocks.get(request_id, [])]

    def get_computed_blocks(self, request: Request) -> tuple[list[KVBlock], int]:
        """Leading cached blocks of a request being admitted, and the tokens they cover."""
        if not self.enable_prefix_caching or not request.prefix_cacheable:
            return [], 0
        # The last token is always recomputed: its logits are what the step samples from.
        max_blocks = (request.num_tokens - 1) // self.block_size
        self._extend_hashes(request, max_blocks)
        hits: list[KVBlock] = []
        for block_hash in request.block_hashes[:max_blocks]:
            block = self.pool.get_cached_block(block_hash)
            if block is None:
                break
            hits.append(block)
        return hits, len(hits) * self.block_size

    def allocate_slots(
        self, request: Request, num_new_tokens: int, computed_blocks: list[KVBlock] | None = None
    ) -> list[int] | None:
        """Room for ``num_new_tokens`` more tokens; returns the ids of blocks added, or None if full."""
        blocks = self._req_blocks.get(request.request_id, ())
        if not computed_blocks and request.num_computed_tokens + num_new_tokens <= len(blocks) * self.block_size \
                and not self._keys_more(request):
            return []  # the decode fast path: the request's last block still has room
        computed_blocks = computed_blocks or []
        num_computed = request.num_computed_tokens + len(computed_blocks) * self.block_size
        total = num_computed + num_new_tokens
        need = cdiv(total, self.block_size) - len(blocks) - len(computed_blocks)
        # Hits sitting in the free queue stop being free once touched.
        revived = sum(1 for b in computed_blocks if b.ref_cnt == 0)
        if need > self.pool.num_free_blocks - revived:
            return None
        self.pool.touch(computed_blocks)
        held = computed_blocks or blocks
        added = computed_blocks + self.pool.get_new_blocks(max(need, 0), after=held[-1] if held else None)
        # Stored only on success, so a refused admission leaves no empty entry behind.
        self._req_blocks.setdefault(request.request_id, []).extend(added)
        if self._keys_more(request):
            self._cache_full_blocks(request, min(total, request.num_keyed_tokens) // self.block_size)
        return [b.block_id for b in added]

    def _keys_more(self, request: Request) -> bool:
        """Whether blocks of this request may still join the prefix index."""
        return self.enable_prefix_caching and request.prefix_cacheable and \
            self._num_cached_blocks.get(request.request_id, 0) < request.num_keyed_tokens // self.block_size

    def free(self, request: Request) -> None:
        blocks = self._req_blocks.pop(request.request_id, [])
        self._num_cached_blocks.pop(request.request_id, None)
        self.pool.free_blocks(reversed(blocks))

    def _cache_full_blocks(self, request: Request, num_full: int) -> None:
        done = self._num_cached_blocks.get(request.request_id, 0)
        if num_full <= done:
            return
        self._extend_hashes(request, num_full)
        blocks = self._req_blocks[request.request_id]
        for i in range(done, num_full):
            self.pool.cache_full_block(blocks[i], request.block_hashes[i])
        self._num_cached_blocks[request.request_id] = num_full

    def _extend_hashes(self, request: Request, num_blocks: int) -> None:
        hashes = request.block_hashes
        bs = self.block_size
        for i in range(len(hashes), num_blocks):
            parent = hashes[-1] if hashes else None
            start, end = i * bs, (i + 1) * bs
            hashes.append(hash_block(parent, request.token_ids(start, end), request.mm_spans_in(start, end)))
