"""ITU-T G.711 μ-law and A-law at 8 kHz (the telephony formats of OpenAI's Realtime API: audio/pcmu, audio/pcma).

Decoding goes through a 256-entry table per law; encoding follows the standard's
segment search on 16-bit samples. Both are vectorised with numpy.
"""

from __future__ import annotations

import numpy as np

G711_RATE = 8000
_BIAS, _CLIP = 0x84, 32635


def _ulaw_table() -> np.ndarray:
    codes = ~np.arange(256, dtype=np.int32) & 0xFF
    exponent = (codes >> 4) & 0x07
    magnitude = (((codes & 0x0F) << 3) + _BIAS) << exponent
    return np.where(codes & 0x80, _BIAS - magnitude, magnitude - _BIAS).astype(np.int16)


def _alaw_table() -> np.ndarray:
    codes = np.arange(256, dtype=np.int32) ^ 0x55
    exponent = (codes >> 4) & 0x07
    mantissa = codes & 0x0F
    magnitude = np.where(exponent == 0, (mantissa << 4) + 8, ((mantissa << 4) + 0x108) << np.maximum(exponent - 1, 0))
    return np.where(codes & 0x80, magnitude, -magnitude).astype(np.int16)


ULAW_TO_PCM = _ulaw_table()
ALAW_TO_PCM = _alaw_table()


def decode_g711(data: bytes, law: str) -> np.ndarray:
    """G.711 bytes (``law``: ``ulaw`` or ``alaw``) → float32 samples in [-1, 1]."""
    table = ULAW_TO_PCM if law == "ulaw" else ALAW_TO_PCM
    return table[np.frombuffer(data, dtype=np.uint8)].astype(np.float32) / 32768.0


def _segment(magnitude: np.ndarray, base: int) -> np.ndarray:
    """The exponent of each magnitude: the highest set bit at or above ``base``, less ``base``."""
    bits = np.floor(np.log2(np.maximum(magnitude, 1))).astype(np.int32)
    return np.clip(bits - base, 0, 7)


def encode_ulaw(samples: np.ndarray) -> bytes:
    pcm = np.clip(np.asarray(samples, dtype=np.float32) * 32768.0, -32768, 32767).astype(np.int32)
    sign = np.where(pcm < 0, 0x80, 0)
    magnitude = np.minimum(np.abs(pcm), _CLIP) + _BIAS
    exponent = _segment(magnitude, 7)
    mantissa = (magnitude >> (exponent + 3)) & 0x0F
    return (~(sign | (exponent << 4) | mantissa) & 0xFF).astype(np.uint8).tobytes()


def encode_alaw(samples: np.ndarray) -> bytes:
    pcm = np.clip(np.asarray(samples, dtype=np.float32) * 32768.0, -32768, 32767).astype(np.int32)
    sign = np.where(pcm >= 0, 0x80, 0)
    magnitude = np.minimum(np.abs(pcm), 32767)
    exponent = np.where(magnitude >= 256, _segment(magnitude, 7), 0)
    mantissa = np.where(exponent == 0, magnitude >> 4, magnitude >> (exponent + 3)) & 0x0F
    return ((sign | (exponent << 4) | mantissa) ^ 0x55).astype(np.uint8).tobytes()


def encode_g711(samples: np.ndarray, law: str) -> bytes:
    return encode_ulaw(samples) if law == "ulaw" else encode_alaw(samples)
