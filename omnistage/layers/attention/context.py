"""The forward context: what the runner publishes for one model forward.

nano-vllm's habit: the model's forward takes only inputs and positions; the
attention layers read the step's metadata, their KV cache and the backend from
here. One context is active per thread at a time.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from omnistage.layers.attention.base import AttentionBackend, AttentionMetadata


@dataclass
class ForwardContext:
    meta: AttentionMetadata
    backend: AttentionBackend
    # One cache per attention layer, indexed by the layer's ``layer_idx``; None = no cache.
    kv_caches: list[torch.Tensor] | None = None

    def kv_cache(self, layer_idx: int) -> torch.Tensor | None:
        return None if self.kv_caches is None else self.kv_caches[layer_idx]


_local = threading.local()


@contextmanager
def forward_context(ctx: ForwardContext) -> Iterator[ForwardContext]:
    previous = getattr(_local, "ctx", None)
    _local.ctx = ctx
    try:
        yield ctx
    finally:
        _local.ctx = previous


def get_forward_context() -> ForwardContext:
    ctx = getattr(_local, "ctx", None)
    if ctx is None:
        raise RuntimeError("no forward context: run the model inside omnistage.layers.attention.forward_context()")
    return ctx
