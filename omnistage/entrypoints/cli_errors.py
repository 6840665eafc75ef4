"""The user's common mistakes as one line that says what to do, not a traceback.

:func:`explain` knows the exceptions that mean "what you asked for cannot be done as asked" (a model folder that
is not there, a stage config field that is wrong, a cache that cannot be written, a port in use...); anything it
does not know is a bug and keeps its traceback. ``--log-level debug`` shows the traceback of known ones too.
"""

from __future__ import annotations

import os
from pathlib import Path

from omnistage.config.pipeline import ConfigError
from omnistage.families.registry import UnknownFamily
from omnistage.usage_error import UsageError

EXIT_USAGE = 2


def explain(exc: BaseException) -> str | None:
    """The one line for a known mistake (whitespace folded: a YAML error spans lines), or None for anything else."""
    message = _explain(exc)
    return None if message is None else " ".join(message.split())


def _explain(exc: BaseException) -> str | None:
    if isinstance(exc, (UsageError, UnknownFamily)):
        return str(exc)
    if isinstance(exc, ConfigError):
        return f"stage config: {exc}"
    if isinstance(exc, ModuleNotFoundError):
        return (f"{exc}: this installation is incomplete; reinstall omnistage (`pip install .` in its folder, or "
                "`make serve`, which installs what it needs)")
    if isinstance(exc, OSError) and _in_cache(exc.filename):
        return _cache(exc)
    if isinstance(exc, PermissionError):
        return f"{exc.strerror or 'permission denied'}: {exc.filename}" if exc.filename else str(exc)
    if isinstance(exc, FileNotFoundError):
        return str(exc) if exc.filename is None else f"no such file or folder: {exc.filename}"
    named = _known_by_name(exc)
    if named is not None:
        return named
    return None


def _known_by_name(exc: BaseException) -> str | None:
    """Errors of modules the CLI should not import just to name them (torch-heavy ones): matched by class name
    along the exception's MRO."""
    known = {"KVBudgetError": "KV cache", "WeightLoadError": "checkpoint", "UnsupportedQuantization": "checkpoint",
             "NoFit": "plan", "RayJoinError": "Ray"}
    for cls in type(exc).__mro__:
        if cls.__name__ in known:
            return f"{known[cls.__name__]}: {exc}"
    return None


def _in_cache(filename: object) -> bool:
    """Whether an OS error is about the model cache folder (or a folder above it that had to be made)."""
    if not filename:
        return False
    from omnistage.tiny.cache import cache_root

    where, cache = Path(str(filename)), cache_root()
    return where == cache or cache in where.parents or where in cache.parents


def _cache(exc: OSError) -> str:
    from omnistage.tiny.cache import cache_root

    source = "$OMNISTAGE_CACHE" if os.environ.get("OMNISTAGE_CACHE") else "the default, ~/.cache/omnistage"
    return (f"cannot write the model cache {cache_root()} ({source}): {exc.strerror}; set OMNISTAGE_CACHE to a "
            "folder you can write, e.g. OMNISTAGE_CACHE=/tmp/omnistage-cache")
