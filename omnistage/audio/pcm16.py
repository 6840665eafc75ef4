"""Float samples as PCM16: its bytes (``float_to_pcm16``), or their base64 text as streamed audio deltas carry it,
in one C pass (``pcm16_base64``).

``pcm16_base64.c`` (built at first use: :class:`~omnistage.native_library.NativeLibrary`) writes the text straight
into the buffer of the event that carries it; without a compiler it is ``base64.b64encode(float_to_pcm16(...))``,
the same bytes.
"""

from __future__ import annotations

import base64
import ctypes
import sys
from pathlib import Path

import numpy as np

from omnistage.native_library import NativeLibrary


def _bind(lib: ctypes.CDLL) -> None:
    lib.pcm16_base64.argtypes = (ctypes.c_void_p, ctypes.c_long, ctypes.c_void_p)
    lib.pcm16_base64.restype = ctypes.c_long


_LIBRARY = NativeLibrary(Path(__file__).with_name("pcm16_base64.c"), ("-O3", "-march=native", "-fPIC"), _bind,
                         "streamed PCM16 is converted with numpy and base64")


def float_to_pcm16(samples: np.ndarray) -> bytes:
    """Little-endian 16-bit PCM; out-of-range samples are clipped rather than wrapped."""
    clipped = np.clip(np.asarray(samples, dtype=np.float32).reshape(-1), -1.0, 1.0)
    return (clipped * 32767.0).astype("<i2").tobytes()


def encoded_size(samples: int) -> int:
    """Characters of the base64 text of ``samples`` PCM16 samples."""
    return 4 * -(-2 * samples // 3)


def preload() -> None:
    """Builds (or finds) the C pass now, at start-up, rather than in the first streamed chunk's event-loop turn."""
    _LIBRARY.load()


def pcm16_base64(samples: np.ndarray, head: bytes = b"", tail: bytes = b"", *, native: bool = True) -> bytes:
    """``head``, the base64 text of ``float_to_pcm16(samples)``, then ``tail``, as one bytes object (``native``:
    written by the C pass when it is built)."""
    lib = _LIBRARY.load() if native and sys.byteorder == "little" else None  # the C pass writes int16 as they lie
    if lib is None:
        return b"".join((head, base64.b64encode(float_to_pcm16(samples)), tail))
    flat = np.ascontiguousarray(samples, dtype=np.float32).reshape(-1)
    size = encoded_size(flat.size)
    out = bytearray(len(head) + size + len(tail))
    out[:len(head)] = head
    out[len(head) + size:] = tail
    body = (ctypes.c_char * len(out)).from_buffer(out)
    lib.pcm16_base64(flat.ctypes.data, flat.size, ctypes.addressof(body) + len(head))
    del body  # the buffer export ends here, so ``out`` may be read as bytes
    return bytes(out)
