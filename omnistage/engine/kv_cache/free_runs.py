"""The free blocks that hold no cached prefix, kept as runs of consecutive block ids.

The block pool hands these out by position rather than by age (they carry nothing worth keeping), so each
request's blocks can stay consecutive: a request grows into the block right after its last one, and a request
starting fresh lands where the longest run leaves the most room. CPU decode attention makes a few torch calls per
run of consecutive blocks in a block table, so 16 requests growing in turn must not take each other's next block.
"""

from __future__ import annotations

import heapq
from bisect import bisect_right, insort


class FreeRuns:
    """A set of block ids with O(log n) add/remove and the longest run of consecutive ids on demand."""

    def __init__(self) -> None:
        self._members: set[int] = set()
        self._starts: list[int] = []  # sorted run starts, to find the run holding an id
        self._end: dict[int, int] = {}  # run start -> end (exclusive)
        self._start_of: dict[int, int] = {}  # run end (exclusive) -> start
        self._longest: list[tuple[int, int, int]] = []  # (-length, start, end); stale entries skipped on read

    def __len__(self) -> int:
        return len(self._members)

    def __contains__(self, block_id: object) -> bool:
        return block_id in self._members

    def add(self, block_id: int) -> None:
        if block_id in self._members:
            raise RuntimeError(f"block {block_id} is already free")
        self._members.add(block_id)
        start, end = block_id, block_id + 1
        if block_id in self._start_of:  # a run ends right before it: join it
            start = self._start_of[block_id]
            self._drop(start)
        if end in self._end:  # a run starts right after it: join it
            end = self._end[end]
            self._drop(block_id + 1)
        self._put(start, end)

    def remove(self, block_id: int) -> None:
        self._members.remove(block_id)
        start = self._starts[bisect_right(self._starts, block_id) - 1]
        end = self._end[start]
        self._drop(start)
        if start < block_id:
            self._put(start, block_id)
        if block_id + 1 < end:
            self._put(block_id + 1, end)

    def longest(self) -> tuple[int, int] | None:
        """``(start, end)`` of a longest run, or None when empty."""
        while self._longest:
            _, start, end = self._longest[0]
            if self._end.get(start) == end:
                return start, end
            heapq.heappop(self._longest)
        return None

    def _put(self, start: int, end: int) -> None:
        insort(self._starts, start)
        self._end[start] = end
        self._start_of[end] = start
        heapq.heappush(self._longest, (start - end, start, end))
        if len(self._longest) > 4 * len(self._end) + 64:  # stale entries pile up under the top: rebuild
            self._longest = [(s - e, s, e) for s, e in self._end.items()]
            heapq.heapify(self._longest)

    def _drop(self, start: int) -> None:
        self._starts.pop(bisect_right(self._starts, start) - 1)
        del self._start_of[self._end.pop(start)]
