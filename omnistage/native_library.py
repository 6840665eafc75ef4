"""A C source of the package built at first use by the system C compiler and loaded with ctypes.

Each library is built for this CPU into ``~/.cache/omnistage/kernels/`` under a name that hashes the source, the
flags, the compiler and the CPU's model and flags, so a home directory shared between machines never loads
another CPU's build; the file appears by an atomic rename, so processes starting together never load half of
one. Where no compiler is found or the build fails, :meth:`NativeLibrary.load` returns None and the caller keeps
its Python path (said once in the log).
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
from collections.abc import Callable
from pathlib import Path

logger = logging.getLogger(__name__)


def _cpu_signature() -> str:
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return os.uname().machine
    return "\n".join(sorted({line for line in lines if line.startswith(("model name", "flags"))}))


class NativeLibrary:
    """``source`` compiled with ``flags`` (linked separately, without them: ``-ffast-math`` at link time would add
    crtfastmath.o, which sets flush-to-zero for the whole process at load); ``bind`` declares the functions'
    argument and result types once loaded; ``fallback`` says what runs instead when it cannot be built;
    ``link_flags``: what the link step needs besides (``-fopenmp`` for a library that names libgomp); ``headers``:
    files the source includes, hashed with it (an edited header builds a new library)."""

    def __init__(self, source: Path, flags: tuple[str, ...], bind: Callable[[ctypes.CDLL], None],
                 fallback: str, link_flags: tuple[str, ...] = (), headers: tuple[Path, ...] = ()) -> None:
        self.source, self.flags, self.bind, self.fallback = source, flags, bind, fallback
        self.link_flags, self.headers = link_flags, headers
        self._lock = threading.Lock()
        self._loaded = False
        self._lib: ctypes.CDLL | None = None

    def load(self) -> ctypes.CDLL | None:
        """The library, built if needed (once per process); None where it cannot be built."""
        with self._lock:
            if not self._loaded:
                self._lib, self._loaded = self._load(), True
            return self._lib

    def library_path(self, compiler: str) -> Path:
        version = subprocess.run([compiler, "--version"], capture_output=True, text=True, timeout=30).stdout
        key = hashlib.sha256("\0".join([self.source.read_text(), *(h.read_text() for h in self.headers),
                                        " ".join(self.flags), "separate link",
                                        " ".join(self.link_flags), version,
                                        _cpu_signature()]).encode())
        cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "omnistage" / "kernels"
        return cache / f"{self.source.stem}-{key.hexdigest()[:16]}.so"

    def _load(self) -> ctypes.CDLL | None:
        compiler = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
        if compiler is None:
            logger.info("no C compiler: %s", self.fallback)
            return None
        try:
            path = self.library_path(compiler)
            if not path.exists():
                self._build(compiler, path)
            lib = ctypes.CDLL(str(path))
        except (OSError, subprocess.SubprocessError) as exc:
            detail = getattr(exc, "stderr", b"") or b""
            logger.warning("%s did not build (%s %s); %s", self.source.name, exc,
                           detail.decode(errors="replace")[-500:], self.fallback)
            return None
        self.bind(lib)
        return lib

    def _build(self, compiler: str, target: Path) -> None:
        target.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=target.parent, suffix=".so", delete=False) as tmp:
            partial = Path(tmp.name)
        try:
            obj = partial.with_suffix(".o")
            subprocess.run([compiler, *self.flags, "-c", str(self.source), "-o", str(obj)], check=True,
                           capture_output=True, timeout=120)
            subprocess.run([compiler, "-shared", *self.link_flags, str(obj), "-o", str(partial), "-lm"], check=True,
                           capture_output=True, timeout=120)
            os.replace(partial, target)
        finally:
            partial.unlink(missing_ok=True)
            partial.with_suffix(".o").unlink(missing_ok=True)
