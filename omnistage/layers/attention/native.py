"""The CPU paged decode kernel (``paged_decode.c``): built at first use by the system C compiler, loaded with ctypes
(:class:`~omnistage.native_library.NativeLibrary`: built for this CPU, cached by a hash of source, flags,
compiler and CPU). Where no compiler is found or the build fails, :func:`load` returns None and attention keeps its
torch path (said once in the log).
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import torch

from omnistage.native_library import NativeLibrary

SOURCE = Path(__file__).with_name("paged_decode.c")
# -ffast-math at compile time only (vectorised expf from libmvec, reassociated sums): linking with it would add
# crtfastmath.o, which sets flush-to-zero for the whole process at load (denormals would read as 0 everywhere).
FLAGS = ("-O3", "-march=native", "-mprefer-vector-width=512", "-ffast-math", "-fopenmp-simd", "-fPIC")
_P, _I, _L = ctypes.c_void_p, ctypes.c_int, ctypes.c_long
# paged_decode(q, cache, bf16, num_blocks, page, kv_heads, group, d, tables, table_stride, ctx, seqs, rows, n,
#              window, scratch, out)
ARGTYPES = (_P, _P, _I, _L, _I, _I, _I, _I, _P, _I, _P, _P, _P, _I, _I, _P, _P)


def _bind(lib: ctypes.CDLL) -> None:
    lib.paged_decode.argtypes = ARGTYPES
    lib.paged_decode.restype = ctypes.c_int


_LIBRARY = NativeLibrary(SOURCE, FLAGS, _bind, "CPU decode attention runs on torch ops")


def load() -> ctypes.CDLL | None:
    """The kernel's library, built if needed (once per process); None where it cannot be built."""
    return _LIBRARY.load()


def paged_decode(lib: ctypes.CDLL, q: torch.Tensor, kv_cache: torch.Tensor, tables: torch.Tensor,
                 context_lens: torch.Tensor, seqs: torch.Tensor, rows: torch.Tensor, window: int | None,
                 max_len: int, out: torch.Tensor) -> None:
    """Decode rows ``rows`` (of sequences ``seqs``) of ``q [T, Hkv, G, D]`` (scaled, float32, contiguous) over
    ``kv_cache [2, blocks, page, Hkv, D]`` (float32 or bfloat16), written into the same rows of ``out``."""
    _, num_blocks, page, kv_heads, head_dim = kv_cache.shape
    group = q.shape[2]
    scratch = torch.empty(group * max_len, dtype=torch.float32)
    lib.paged_decode(
        q.data_ptr(), kv_cache.data_ptr(), int(kv_cache.dtype == torch.bfloat16), num_blocks, page, kv_heads, group,
        head_dim, tables.data_ptr(), tables.stride(0), context_lens.data_ptr(), seqs.data_ptr(), rows.data_ptr(),
        seqs.numel(), window or 0, scratch.data_ptr(), out.data_ptr())
