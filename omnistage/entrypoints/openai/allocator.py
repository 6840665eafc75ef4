"""The API process's allocator: a large block is given back to the system when it is freed.

glibc's malloc serves a request of at least ``M_MMAP_THRESHOLD`` bytes with a mapping of its own, unmapped on
free; smaller ones come from arenas, which keep what is freed for reuse. By default the threshold is dynamic:
freeing a mapped block raises it to that block's size (up to 32 MiB) and the trim threshold to twice that. So
after the first large request body, the buffers of every later one below 32 MiB (uvicorn's body, msgspec's
strings, the 1 MiB base64 slices and their join, a decoded WAV) come from arenas and stay resident once freed,
at each thread's high-water mark, fragmented. Setting the threshold turns the adjustment off.

Measured with the API's own pieces (body joined from 64 KiB chunks, msgspec decode, ``decode_base64``,
``load_audio``), four 60 MB ``data:`` WAV requests at once in threads, five rounds: RSS above the start
+57 to +137 MiB by default, +21 to +27 MiB with the threshold fixed at 1 MiB; ``M_ARENA_MAX`` 2 alone
+64 to +162 MiB (no help). Blocks of 1 MiB and more cost an mmap and its page faults each: nothing on the API
process's paths, where they are request bodies and media. The stage processes are left as they are: they
allocate large tensors every step, where a mapping per block would add page faults to the hot path.
"""

from __future__ import annotations

import ctypes

from omnistage.libc import libc_function

M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter number
MMAP_THRESHOLD_BYTES = 1 << 20


def return_large_blocks_to_the_system() -> bool:
    """Fixes glibc's mmap threshold at 1 MiB for this process; False where the C library is not glibc."""
    mallopt = libc_function("mallopt", [ctypes.c_int, ctypes.c_int], ctypes.c_int)
    return mallopt is not None and bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES))
