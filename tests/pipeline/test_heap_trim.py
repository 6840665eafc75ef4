"""A stage replica gives freed heap back while it waits for work, at most once per interval."""

from __future__ import annotations

import ctypes

import pytest

from omnistage.libc import libc_function
from omnistage.pipeline.heap_trim import IdleHeapTrim


def test_trims_only_once_the_interval_has_passed() -> None:
    now = [100.0]
    calls: list[int] = []
    heap = IdleHeapTrim(interval_s=5.0, clock=lambda: now[0], trim=lambda pad: calls.append(pad) or 1)
    assert not heap.idle()  # just started: nothing for 5 s
    now[0] = 104.9
    assert not heap.idle() and calls == []
    now[0] = 105.0
    assert heap.idle() and calls == [0]
    now[0] = 109.0
    assert not heap.idle() and calls == [0]
    now[0] = 110.5
    assert heap.idle() and calls == [0, 0]


def _rss_mib() -> float:
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmRSS")) / 1024


def test_glibc_gives_back_freed_arena_pages() -> None:
    """What the trim is for: 256 MiB freed below a block still in use stays resident until trimmed."""
    trim = libc_function("malloc_trim", [ctypes.c_size_t], ctypes.c_int)
    if trim is None:
        pytest.skip("no malloc_trim in this C library")
    libc = ctypes.CDLL(None)
    libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    block = 64 * 1024  # below glibc's mmap threshold: served from the heap
    blocks = [libc.malloc(block) for _ in range(4096)]
    for address in blocks:
        ctypes.memset(address, 1, block)
    pinned = libc.malloc(block)  # above them all: freeing them cannot shrink the heap's top
    for address in blocks:
        libc.free(address)
    held = _rss_mib()
    trim(0)
    after = _rss_mib()
    libc.free(pinned)
    assert held - after > 128, (held, after)
