"""One stage engine's sizes: KV blocks, batch limits, and how the runner executes."""

from __future__ import annotations

from dataclasses import dataclass

import torch


def auto_device(device: str) -> str:
    """A stage config's device with ``"auto"`` resolved: CUDA when this process sees a GPU, else the CPU."""
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return device


# --kv-cache-dtype names that are not torch's (vLLM's fp8 spellings); any other name is torch's own.
_KV_CACHE_DTYPES = {"fp8_e5m2": torch.float8_e5m2, "fp8_e4m3": torch.float8_e4m3fn}


def kv_cache_dtype_named(name: str) -> torch.dtype | None:
    """A ``--kv-cache-dtype`` / ``kv_cache_dtype:`` name as a torch dtype; None for ``auto`` (the model's)."""
    return None if name == "auto" else _KV_CACHE_DTYPES.get(name) or getattr(torch, name)


@dataclass(frozen=True)
class EngineConfig:
    """Limits shared by the scheduler and the runner of one stage.

    max_num_batched_tokens: the per-step token budget covering prefill and decode alike.
    long_prefill_token_threshold: cap on one request's prefill chunk per step, so a long
        multimodal prompt is spread over steps instead of stalling running decodes; 0 = budget.
    num_blocks: KV blocks per layer including the reserved null block, unless a budget below sizes the pool.
    kv_cache_memory: bytes for the KV cache (0: not set); the runner sizes num_blocks from it.
    gpu_memory_utilization: on CUDA, the fraction of the device the stage may use (0: not set); the runner
        profiles weights and a worst-case forward and gives the rest to the KV cache.
    cuda_graph_max_batch: largest decode batch captured as a CUDA graph (0 disables).
    kv_cache_dtype: what the KV cache stores (None: the model's dtype); bfloat16 halves a CPU stage's cache.
    """

    block_size: int = 16
    num_blocks: int = 1024
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 2048
    long_prefill_token_threshold: int = 0
    max_model_len: int = 4096
    enable_prefix_caching: bool = True
    device: str = "cpu"
    dtype: torch.dtype = torch.float32
    enforce_eager: bool = False
    cuda_graph_max_batch: int = 64
    kv_cache_memory: int = 0
    gpu_memory_utilization: float = 0.0
    kv_cache_dtype: torch.dtype | None = None

    def __post_init__(self) -> None:
        if self.block_size < 1 or self.num_blocks < 2:
            raise ValueError("block_size must be >= 1 and num_blocks >= 2")
        if self.max_num_seqs < 1 or self.max_num_batched_tokens < 1:
            raise ValueError("max_num_seqs and max_num_batched_tokens must be >= 1")
        if self.max_num_batched_tokens < self.max_num_seqs:
            raise ValueError("max_num_batched_tokens must cover one decode token per sequence")
        if self.kv_cache_memory < 0 or not 0.0 <= self.gpu_memory_utilization <= 1.0:
            raise ValueError("kv_cache_memory must be >= 0 and gpu_memory_utilization in [0, 1]")

    @property
    def cache_dtype(self) -> torch.dtype:
        return self.kv_cache_dtype or self.dtype

    @property
    def max_blocks_per_seq(self) -> int:
        return -(-self.max_model_len // self.block_size)

    @property
    def prefill_chunk_cap(self) -> int:
        return self.long_prefill_token_threshold or self.max_num_batched_tokens
