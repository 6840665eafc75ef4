"""The pool of KV-cache blocks: ref counts, an LRU free queue, and the prefix-cache index.

A block whose ref count drops to zero goes to the back of the free queue but
keeps its hash, so a later request with the same prefix can revive it; it is
only forgotten when the queue hands it out again (LRU eviction). Block 0 is
the null block: never handed out, it is where padded rows (CUDA-graph replay)
write their throw-away keys and values.

Free blocks holding no cached prefix are handed out first, by position (:class:`FreeRuns`): a request grows into
the block after its last one when that is free, and otherwise starts where the longest free run leaves it room,
so requests decoding side by side keep their blocks consecutive (CPU decode attention reads a block table run by
run). Cached free blocks keep their LRU order and are used only when no uncached one is left.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass

from omnistage.engine.kv_cache.free_runs import FreeRuns


@dataclass(eq=False)
class KVBlock:
    block_id: int
    ref_cnt: int = 0
    # Hash of the full block's tokens chained with its prefix; None while partial or uncached.
    block_hash: bytes | None = None


class BlockPool:
    def __init__(self, num_blocks: int, enable_caching: bool = True) -> None:
        if num_blocks < 2:
            raise ValueError(f"need at least 2 KV blocks (one is the null block), got {num_blocks}")
        self.num_blocks = num_blocks
        self.enable_caching = enable_caching
        self.blocks = [KVBlock(i) for i in range(num_blocks)]
        self.null_block = self.blocks[0]
        # Insertion order is eviction order: the head is the least recently freed block.
        self._free: OrderedDict[int, KVBlock] = OrderedDict((b.block_id, b) for b in self.blocks[1:])
        self._cached: dict[bytes, KVBlock] = {}
        self._uncached = FreeRuns()  # the free blocks without a hash, by position
        for block in self.blocks[1:]:
            self._uncached.add(block.block_id)

    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    @property
    def usage(self) -> float:
        return 1.0 - len(self._free) / (self.num_blocks - 1)

    def get_new_blocks(self, n: int, after: KVBlock | None = None) -> list[KVBlock]:
        """``n`` blocks for a request whose last block is ``after`` (None: it has none yet), consecutive with it
        and with each other where the free blocks allow."""
        if n > len(self._free):
            raise ValueError(f"asked for {n} blocks, {len(self._free)} free")
        out: list[KVBlock] = []
        for i in range(n):
            block = self._take(out[-1] if out else after, n - i)
            block.ref_cnt = 1
            out.append(block)
        return out

    def _take(self, after: KVBlock | None, wanted: int) -> KVBlock:
        if after is not None and after.block_id + 1 in self._uncached:
            return self._claim(self.blocks[after.block_id + 1])
        run = self._uncached.longest()
        if run is None:  # only cached blocks are free: the least recently freed one is evicted
            _, block = self._free.popitem(last=False)
            self._evict(block)
            return block
        start, end = run
        # A run right after a block in use may be that request's room to grow: start further in, leaving it half.
        if self.blocks[start - 1].ref_cnt > 0:
            start += max(end - start - wanted, 0) // 2
        return self._claim(self.blocks[start])

    def _claim(self, block: KVBlock) -> KVBlock:
        self._uncached.remove(block.block_id)
        del self._free[block.block_id]
        return block

    def get_cached_block(self, block_hash: bytes) -> KVBlock | None:
        return self._cached.get(block_hash)

    def touch(self, blocks: Iterable[KVBlock]) -> None:
        """Takes a reference on prefix-cache hits, reviving free ones out of the queue."""
        for block in blocks:
            if block.ref_cnt == 0:
                del self._free[block.block_id]
            block.ref_cnt += 1

    def cache_full_block(self, block: KVBlock, block_hash: bytes) -> None:
        if not self.enable_caching or block.block_hash is not None:
            return
        block.block_hash = block_hash
        # Two requests may fill identical blocks in the same step; the first one stays the index entry.
        self._cached.setdefault(block_hash, block)

    def free_blocks(self, blocks: Iterable[KVBlock]) -> None:
        """Drops one reference each; pass a request's blocks tail first so tails are evicted first."""
        for block in blocks:
            block.ref_cnt -= 1
            if block.ref_cnt < 0:
                raise RuntimeError(f"block {block.block_id} freed more times than taken")
            if block.ref_cnt == 0:
                self._free[block.block_id] = block
                if block.block_hash is None:
                    self._uncached.add(block.block_id)

    def _evict(self, block: KVBlock) -> None:
        if block.block_hash is None:
            return
        if self._cached.get(block.block_hash) is block:
            del self._cached[block.block_hash]
        block.block_hash = None

    def reset_prefix_cache(self) -> None:
        for block in self._cached.values():
            block.block_hash = None
            if block.ref_cnt == 0:
                self._uncached.add(block.block_id)
        self._cached.clear()
