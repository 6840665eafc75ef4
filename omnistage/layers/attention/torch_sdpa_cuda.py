"""Torch SDPA over paged blocks, safe to capture in CUDA graphs (the GPU path without flash-attn).

The CPU backend filters padding rows (slot -1) before storing, which needs a
host sync. Here decode steps send those rows to slot 0 of the null block
instead (the engine never hands block 0 to a request), so a decode step is
all device work with fixed shapes. Prefill and mixed steps use the CPU
backend's per-sequence path unchanged.
"""

from __future__ import annotations

import torch

from omnistage.layers.attention.base import AttentionMetadata
from omnistage.layers.attention.torch_sdpa import TorchSDPABackend


def store_kv_unchecked(kv_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    num_blocks, block_size = kv_cache.shape[1], kv_cache.shape[2]
    flat = kv_cache.view(2, num_blocks * block_size, *kv_cache.shape[3:])
    slots = slot_mapping.clamp_min(0)  # padding (-1) lands in the null block
    flat[0].index_copy_(0, slots, k)
    flat[1].index_copy_(0, slots, v)


class CudaSDPABackend(TorchSDPABackend):
    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        kv_cache: torch.Tensor | None,
        meta: AttentionMetadata,
        scale: float,
        sliding_window: int | None = None,
    ) -> torch.Tensor:
        if kv_cache is None or sliding_window is not None or not meta.is_decode_only:
            return super().forward(q, k, v, kv_cache, meta, scale, sliding_window)
        store_kv_unchecked(kv_cache, k, v, meta.slot_mapping)
        return self._decode(q, kv_cache, meta, scale)
