"""The CPU paged decode kernel (``paged_decode.c``): built at first use by the system C compiler, loaded with ctypes
(:class:`~omnistage.native_library.NativeLibrary`: built for this CPU, cached by a hash of source, flags,
compiler and CPU). Where no compiler is found or the build fails, :func:`load` returns None and attention keeps its
torch path (said once in the log).
"""

from __future__ import annotations

import ctypes
import logging
import os
from pathlib import Path

import torch

from omnistage.native_library import NativeLibrary

logger = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("paged_decode.c")  # and its AVX-512 passes, paged_decode_avx512.h
# -ffast-math at compile time only (vectorised expf from libmvec, reassociated sums): linking with it would add
# crtfastmath.o, which sets flush-to-zero for the whole process at load (denormals would read as 0 everywhere).
# -fopenmp: the kernel splits a step's sequences and heads over torch's threads. The library names libgomp.so.1,
# which the loader finds already loaded by torch (a CPU wheel's torch/lib/libgomp.so.1), so both share one
# runtime and one pool of threads; where another runtime was loaded instead, the kernel runs on one thread.
FLAGS = ("-O3", "-march=native", "-mprefer-vector-width=512", "-ffast-math", "-fopenmp", "-fPIC")
_P, _I, _L = ctypes.c_void_p, ctypes.c_int, ctypes.c_long
# paged_decode(q, cache, bf16, num_blocks, page, kv_heads, group, d, tables, table_stride, ctx, seqs, rows, n,
#              window, threads, scratch_stride, scratch, out)
ARGTYPES = (_P, _P, _I, _L, _I, _I, _I, _I, _P, _I, _P, _P, _P, _I, _I, _I, _L, _P, _P)

# The cache dtypes the kernel reads, and its code for each (paged_decode.c's KV_F32, KV_BF16, KV_E5M2, KV_E4M3).
CACHE_KINDS = {torch.float32: 0, torch.bfloat16: 1, torch.float8_e5m2: 2, torch.float8_e4m3fn: 3}

_shares_torch_runtime: dict[str, bool] = {}


def _bind(lib: ctypes.CDLL) -> None:
    lib.paged_decode.argtypes = ARGTYPES
    lib.paged_decode.restype = ctypes.c_int
    _shares_torch_runtime["lib"] = len(openmp_runtimes()) <= 1
    if not _shares_torch_runtime["lib"]:
        logger.info("two OpenMP runtimes are loaded (%s): CPU decode attention runs on one thread",
                    ", ".join(sorted(openmp_runtimes())))


_LIBRARY = NativeLibrary(SOURCE, FLAGS, _bind, "CPU decode attention runs on torch ops", link_flags=("-fopenmp",),
                         headers=(SOURCE.with_name("paged_decode_avx512.h"),))


def load() -> ctypes.CDLL | None:
    """The kernel's library, built if needed (once per process); None where it cannot be built."""
    return _LIBRARY.load()


def openmp_runtimes() -> set[str]:
    """The OpenMP runtime files mapped into this process (one when the kernel shares torch's)."""
    try:
        maps = Path("/proc/self/maps").read_text().splitlines()
    except OSError:
        return set()
    paths = {line.split(maxsplit=5)[-1] for line in maps if line.count(" ") >= 5}
    return {os.path.realpath(p) for p in paths if Path(p).name.startswith(("libgomp", "libiomp", "libomp"))}


def kernel_threads() -> int:
    """Threads the kernel may use: torch's intra-op count, or one where its OpenMP runtime is not torch's."""
    return torch.get_num_threads() if _shares_torch_runtime.get("lib", False) else 1


def paged_decode(lib: ctypes.CDLL, q: torch.Tensor, kv_cache: torch.Tensor, tables: torch.Tensor,
                 context_lens: torch.Tensor, seqs: torch.Tensor, rows: torch.Tensor, window: int | None,
                 max_len: int, out: torch.Tensor, threads: int | None = None) -> None:
    """Decode rows ``rows`` (of sequences ``seqs``) of ``q [T, Hkv, G, D]`` (scaled, float32, contiguous) over
    ``kv_cache [2, blocks, page, Hkv, D]`` (a dtype of :data:`CACHE_KINDS`), written into the same rows of ``out``, on
    ``threads`` threads (default :func:`kernel_threads`; a short step runs on one whatever it is)."""
    _, num_blocks, page, kv_heads, head_dim = kv_cache.shape
    group = q.shape[2]
    threads = threads or kernel_threads()
    stride = -(-group * max_len // 16) * 16  # each thread's scores start on their own cache line
    scratch = torch.empty(threads * stride, dtype=torch.float32)
    lib.paged_decode(
        q.data_ptr(), kv_cache.data_ptr(), CACHE_KINDS[kv_cache.dtype], num_blocks, page, kv_heads, group,
        head_dim, tables.data_ptr(), tables.stride(0), context_lens.data_ptr(), seqs.data_ptr(), rows.data_ptr(),
        seqs.numel(), window or 0, threads, stride, scratch.data_ptr(), out.data_ptr())
