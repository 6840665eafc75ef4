"""Tensors by reference, for stages running as threads of one process (no copy at all)."""

from __future__ import annotations

import itertools
import threading

import torch

from omnistage.pipeline.connectors.base import TensorConnector

# Shared by every connector of the process: the sender's and the receiver's are different objects.
_REGISTRY: dict[str, torch.Tensor] = {}
_COUNTER = itertools.count()
_LOCK = threading.Lock()


class InprocConnector(TensorConnector):
    def put(self, tensor: torch.Tensor) -> str:
        key = f"{self.pipeline_id}:{next(_COUNTER)}"
        _REGISTRY[key] = tensor
        return key

    def get(self, key: str, dtype: torch.dtype, shape: tuple[int, ...]) -> torch.Tensor:
        return _REGISTRY.pop(key)

    def cleanup(self) -> None:
        with _LOCK:
            for key in [k for k in _REGISTRY if k.startswith(f"{self.pipeline_id}:")]:
                _REGISTRY.pop(key, None)
