"""The process's C library functions that Python does not wrap (glibc's allocator knobs), looked up once each."""

from __future__ import annotations

import ctypes
import ctypes.util
from collections.abc import Callable
from typing import Any


def libc_function(name: str, argtypes: list[Any], restype: Any) -> Callable[..., int] | None:
    """The C library's ``name`` with its types set, or None where the library lacks it (musl, macOS: no glibc
    extensions such as ``mallopt`` or ``malloc_trim``)."""
    try:
        function = getattr(ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6"), name)
    except (OSError, AttributeError):
        return None
    function.argtypes, function.restype = argtypes, restype
    return function
