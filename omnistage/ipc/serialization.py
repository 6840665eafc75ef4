"""msgspec (msgpack) encoding of messages whose fields may hold torch tensors, without copying them.

A message becomes a list of frames: frame 0 is the msgpack body, and each
large tensor is either one more frame (its own memory, handed to zmq without
a copy and wrapped again on receipt without a copy) or a key from the
pipeline's tensor connector (shared memory, or a reference between threads).
Small tensors are inlined in the body, where a frame would cost more.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Protocol

import msgspec
import numpy as np
import torch

# Received frames are read-only buffers; tensors built on them are only ever read.
warnings.filterwarnings("ignore", message="The given buffer is not writable")

INLINE_MAX_BYTES = 512
_DTYPES: dict[str, torch.dtype] = {
    str(dt).removeprefix("torch."): dt
    for dt in (torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int64, torch.int32,
               torch.int16, torch.int8, torch.uint8, torch.bool)
}


class TensorStore(Protocol):
    """What the codec needs from a connector (``omnistage.pipeline.connectors``)."""

    def put(self, tensor: torch.Tensor) -> str | None: ...

    def get(self, key: str, dtype: torch.dtype, shape: tuple[int, ...]) -> torch.Tensor: ...


class TensorRef(msgspec.Struct, array_like=True):
    """A tensor's place in the message: inline ``data``, out-of-band ``frame`` or connector ``key``."""

    dtype: str
    shape: tuple[int, ...]
    frame: int = -1
    key: str = ""
    data: bytes = b""


def _raw_bytes(tensor: torch.Tensor) -> np.ndarray:
    # Viewed as bytes so bfloat16 (which numpy lacks) travels like any other dtype.
    return tensor.reshape(-1).view(torch.uint8).numpy()


class MessageCodec:
    """Encodes and decodes one message type (a Struct or a tagged union of Structs)."""

    def __init__(self, message_type: object, store: TensorStore | None = None,
                 inline_max_bytes: int = INLINE_MAX_BYTES) -> None:
        self.store = store
        self.inline_max_bytes = inline_max_bytes
        self._encoder = msgspec.msgpack.Encoder(enc_hook=self._enc_hook)
        self._decoder = msgspec.msgpack.Decoder(message_type, dec_hook=self._dec_hook)
        self._out_frames: list[memoryview] = []  # filled while one encode runs
        self._in_frames: Sequence[memoryview | bytes] = ()

    def encode(self, message: msgspec.Struct) -> list[memoryview | bytes]:
        self._out_frames = []
        try:
            body = self._encoder.encode(message)
            return [body, *self._out_frames]
        finally:
            self._out_frames = []

    def decode(self, frames: Sequence[memoryview | bytes]) -> msgspec.Struct:
        self._in_frames = frames
        try:
            return self._decoder.decode(frames[0])
        finally:
            self._in_frames = ()

    def _enc_hook(self, obj: object) -> object:
        if not isinstance(obj, torch.Tensor):
            raise NotImplementedError(f"cannot encode {type(obj).__name__}")
        tensor = obj.detach().to("cpu").contiguous()
        dtype = str(tensor.dtype).removeprefix("torch.")
        shape = tuple(tensor.shape)
        nbytes = tensor.numel() * tensor.element_size()
        if nbytes <= self.inline_max_bytes:
            return TensorRef(dtype, shape, data=_raw_bytes(tensor).tobytes())
        key = self.store.put(tensor) if self.store is not None else None
        if key is not None:
            return TensorRef(dtype, shape, key=key)
        self._out_frames.append(memoryview(_raw_bytes(tensor)))
        return TensorRef(dtype, shape, frame=len(self._out_frames))

    def _dec_hook(self, kind: type, obj: object) -> object:
        if kind is not torch.Tensor:
            raise NotImplementedError(f"cannot decode {kind}")
        ref = msgspec.convert(obj, TensorRef)
        dtype = _DTYPES[ref.dtype]
        if ref.key:
            if self.store is None:
                raise ValueError("message refers to a connector key but this codec has no connector")
            return self.store.get(ref.key, dtype, ref.shape)
        raw = ref.data if ref.frame < 0 else self._in_frames[ref.frame]
        if len(raw) == 0:
            return torch.empty(ref.shape, dtype=dtype)
        # bytearray for inline data: a small copy, and the tensor is then writable.
        buffer = bytearray(raw) if ref.frame < 0 else raw
        return torch.frombuffer(buffer, dtype=dtype).reshape(ref.shape)
