"""The embedded random checkpoints' cache (``$OMNISTAGE_CACHE``): each made once, on first use, whole or not at all."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path


def cache_root() -> Path:
    """``$OMNISTAGE_CACHE`` or ``~/.cache/omnistage``."""
    return Path(os.environ.get("OMNISTAGE_CACHE", Path.home() / ".cache" / "omnistage"))


def cached_build(name: str, build: Callable[[Path], object], marker: str = "model.safetensors") -> Path:
    """``cache_root()/name``, built by ``build(folder)`` on first use (every family's embedded checkpoints).

    Built in a temporary sibling folder and renamed into place, so a crash or a concurrent builder never leaves
    a half-written checkpoint behind; ``marker``, a file written last, says the folder is complete.
    """
    target = cache_root() / name
    if (target / marker).exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=target.parent))
    try:
        build(tmp)
        try:
            tmp.rename(target)
        except OSError:
            if not (target / marker).exists():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target
