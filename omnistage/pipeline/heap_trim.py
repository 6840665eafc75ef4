"""A stage process hands its freed heap back to the system while it waits for work (glibc's ``malloc_trim``).

The API process maps its large blocks on their own (``entrypoints/openai/allocator.py``); a stage process
allocates large tensors every step, where a mapping per block would add an mmap and its page faults to the hot
path. So its arenas keep what a step freed, at the high-water mark of the largest batch of each shape seen so
far, fragmented: a codec process grew for as long as new peaks came (+5.9% from the first to the last quarter of
a half hour's soak, after ten minutes of warm-up). ``malloc_trim(0)`` gives back every whole free page of every
arena; the next peak faults them in again. It runs when the loop is about to wait for work with nothing queued,
at most once per ``interval_s``, so a busy stage never pays it between steps.

Measured: the medium checkpoint's code2wav decoding 600 random batches (1-8 streams' first chunks of 4-30 frames,
one thread) held 678 MiB after 50 batches and 974 after 600, rising with each new peak; with a trim every 50
batches, 477 → 506 MiB (what is left is oneDNN's primitive cache: one per conv shape, at most 1,024). A trim of a
fragmented 230 MiB heap takes 0.2-0.6 ms.
"""

from __future__ import annotations

import ctypes
import time
from collections.abc import Callable

from omnistage.libc import libc_function

TRIM_INTERVAL_S = 5.0


class IdleHeapTrim:
    def __init__(self, interval_s: float = TRIM_INTERVAL_S, clock: Callable[[], float] = time.monotonic,
                 trim: Callable[[int], int] | None = None) -> None:
        self.interval_s = interval_s
        self.clock = clock
        self._trim = trim if trim is not None else libc_function("malloc_trim", [ctypes.c_size_t], ctypes.c_int)
        self._last = clock()

    def idle(self) -> bool:
        """Called when the loop has nothing to do: trims if the last trim is ``interval_s`` old. True if it did."""
        now = self.clock()
        if self._trim is None or now - self._last < self.interval_s:
            return False
        self._trim(0)
        self._last = now
        return True
