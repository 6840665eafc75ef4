"""The CPU paged decode kernel (``paged_decode.c``): built at first use by the system C compiler, loaded with ctypes.

It is built for this CPU (``-march=native``) into ``~/.cache/omnistage/kernels/`` under a name that hashes the
source, the flags, the compiler and the CPU's model and flags, so a home directory shared between machines never
loads another CPU's build; the file appears by an atomic rename, so processes starting together never load half
of one. Where no compiler is found or the build fails, :func:`load` returns None and attention keeps its torch
path (said once in the log).
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

import torch

logger = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("paged_decode.c")
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

_lock = threading.Lock()
_loaded: dict[str, ctypes.CDLL | None] = {}
_shares_torch_runtime: dict[str, bool] = {}


def _cpu_signature() -> str:
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return os.uname().machine
    return "\n".join(sorted({line for line in lines if line.startswith(("model name", "flags"))}))


def _build(compiler: str, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=target.parent, suffix=".so", delete=False) as tmp:
        partial = Path(tmp.name)
    try:
        obj = partial.with_suffix(".o")
        subprocess.run([compiler, *FLAGS, "-c", str(SOURCE), "-o", str(obj)], check=True, capture_output=True,
                       timeout=120)
        subprocess.run([compiler, "-shared", "-fopenmp", str(obj), "-o", str(partial), "-lm"], check=True,
                       capture_output=True, timeout=120)
        os.replace(partial, target)
    finally:
        partial.unlink(missing_ok=True)
        partial.with_suffix(".o").unlink(missing_ok=True)


def library_path(compiler: str) -> Path:
    version = subprocess.run([compiler, "--version"], capture_output=True, text=True, timeout=30).stdout
    key = hashlib.sha256("\0".join([SOURCE.read_text(), " ".join(FLAGS), "separate link", version,
                                    _cpu_signature()]).encode())
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "omnistage" / "kernels"
    return cache / f"paged_decode-{key.hexdigest()[:16]}.so"


def load() -> ctypes.CDLL | None:
    """The kernel's library, built if needed (once per process); None where it cannot be built."""
    with _lock:
        if "lib" not in _loaded:
            _loaded["lib"] = _load()
        return _loaded["lib"]


def _load() -> ctypes.CDLL | None:
    compiler = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if compiler is None:
        logger.info("no C compiler: CPU decode attention runs on torch ops")
        return None
    try:
        path = library_path(compiler)
        if not path.exists():
            _build(compiler, path)
        lib = ctypes.CDLL(str(path))
    except (OSError, subprocess.SubprocessError) as exc:
        detail = getattr(exc, "stderr", b"") or b""
        logger.warning("the CPU decode kernel did not build (%s %s); decode attention runs on torch ops", exc,
                       detail.decode(errors="replace")[-500:])
        return None
    lib.paged_decode.argtypes = ARGTYPES
    lib.paged_decode.restype = ctypes.c_int
    _shares_torch_runtime["lib"] = len(openmp_runtimes()) <= 1
    if not _shares_torch_runtime["lib"]:
        logger.info("two OpenMP runtimes are loaded (%s): CPU decode attention runs on one thread",
                    ", ".join(sorted(openmp_runtimes())))
    return lib


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
    ``kv_cache [2, blocks, page, Hkv, D]`` (float32 or bfloat16), written into the same rows of ``out``, on
    ``threads`` threads (default :func:`kernel_threads`; a short step runs on one whatever it is)."""
    _, num_blocks, page, kv_heads, head_dim = kv_cache.shape
    group = q.shape[2]
    threads = threads or kernel_threads()
    stride = -(-group * max_len // 16) * 16  # each thread's scores start on their own cache line
    scratch = torch.empty(threads * stride, dtype=torch.float32)
    lib.paged_decode(
        q.data_ptr(), kv_cache.data_ptr(), int(kv_cache.dtype == torch.bfloat16), num_blocks, page, kv_heads, group,
        head_dim, tables.data_ptr(), tables.stride(0), context_lens.data_ptr(), seqs.data_ptr(), rows.data_ptr(),
        seqs.numel(), window or 0, threads, stride, scratch.data_ptr(), out.data_ptr())
