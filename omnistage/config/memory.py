"""Memory sizes as people write them in flags and stage configs: ``2GiB``, ``512MiB``, ``4GB``, bytes."""

from __future__ import annotations

import re

# vLLM's CPU backend sizes its KV cache at 4 GiB unless VLLM_CPU_KVCACHE_SPACE says otherwise; a CPU stage given
# no budget gets as much (engine/kv_sizing.py).
CPU_DEFAULT_KV_BYTES = 4 * 2**30

_UNITS = {"": 1, "b": 1, "k": 10**3, "kb": 10**3, "m": 10**6, "mb": 10**6, "g": 10**9, "gb": 10**9,
          "t": 10**12, "tb": 10**12, "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-z]*)\s*$")


def parse_bytes(value: str | int) -> int:
    """``2GiB``, ``512MiB``, ``1.5GB``, ``1000000`` or an int → bytes."""
    if isinstance(value, int) and not isinstance(value, bool):
        if value < 0:
            raise ValueError(f"a memory size must be >= 0, got {value}")
        return value
    match = _SIZE.match(str(value).lower())
    if match is None or match[2] not in _UNITS:
        raise ValueError(f"not a memory size: {value!r} (e.g. 2GiB, 512MiB, 4GB or a byte count)")
    return int(float(match[1]) * _UNITS[match[2]])


def format_bytes(n: int) -> str:
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return f"{n / size:.2f} {unit}"
    return f"{n} B"
