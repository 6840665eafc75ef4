"""One ``.safetensors`` file read with positioned reads: its header once, then any tensor, or rows of one, on demand.

Why not ``safetensors.safe_open``: it maps the whole file, and every page a load touches stays in the process's
resident set (as file-backed pages) until the handle closes, so loading a 60 GB checkpoint shows up as 60 GB of
RSS on top of the model. A positioned read copies just the bytes asked for into the tensor that keeps them; the
page cache holds the rest, where the kernel can drop it. Reading rows of the leading dimension lets the loader
stream one large tensor in slices (one expert, a block of rows) instead of holding it whole.

The format: an 8-byte little-endian header length, a JSON header mapping each name to its dtype, shape and
``data_offsets`` (relative to the end of the header), then the data.
"""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path
from typing import NamedTuple

import torch

DTYPES = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
    "BOOL": torch.bool, "F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2,
}
_MAX_HEADER = 100 << 20  # the format's own limit on the JSON header


class TensorEntry(NamedTuple):
    dtype: torch.dtype
    shape: tuple[int, ...]
    offset: int  # absolute position of the first byte in the file
    nbytes: int


class SafetensorsFile:
    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._fd = os.open(self.path, os.O_RDONLY)
        try:
            self.entries = self._read_header()
        except BaseException:
            os.close(self._fd)
            raise

    def _read_header(self) -> dict[str, TensorEntry]:
        (length,) = struct.unpack("<Q", os.pread(self._fd, 8, 0))
        if length > _MAX_HEADER:
            raise ValueError(f"{self.path}: safetensors header of {length} bytes is over the format's limit")
        header = json.loads(os.pread(self._fd, length, 8))
        entries = {}
        for name, info in header.items():
            if name == "__metadata__":
                continue
            if info["dtype"] not in DTYPES:
                raise ValueError(f"{self.path}: tensor {name!r} has dtype {info['dtype']}, which omnistage cannot read")
            begin, end = info["data_offsets"]
            entries[name] = TensorEntry(DTYPES[info["dtype"]], tuple(info["shape"]), 8 + length + begin, end - begin)
        return entries

    def keys(self) -> list[str]:
        return list(self.entries)

    def read(self, name: str, start: int = 0, stop: int | None = None) -> torch.Tensor:
        """The tensor, or its rows ``start:stop`` of the leading dimension (a new CPU tensor that owns them)."""
        entry = self.entries[name]
        if not entry.shape:
            return self._read_bytes(entry.offset, entry.nbytes).view(entry.dtype).reshape(())
        rows = entry.shape[0]
        stop = rows if stop is None else min(stop, rows)
        start = min(max(start, 0), stop)
        row_bytes = entry.nbytes // rows if rows else 0
        data = self._read_bytes(entry.offset + start * row_bytes, (stop - start) * row_bytes)
        return data.view(entry.dtype).reshape(stop - start, *entry.shape[1:])

    def _read_bytes(self, offset: int, nbytes: int) -> torch.Tensor:
        out = torch.empty(nbytes, dtype=torch.uint8)
        view = memoryview(out.numpy())
        done = 0
        while done < nbytes:
            got = os.preadv(self._fd, [view[done:]], offset + done)
            if got <= 0:
                raise OSError(f"{self.path}: file ends {nbytes - done} bytes short of a tensor at byte {offset}")
            done += got
        return out

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __del__(self) -> None:
        self.close()
