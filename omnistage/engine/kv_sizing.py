"""How many KV blocks a stage gets, from a memory budget, as vLLM sizes its cache.

* ``kv_cache_memory`` (any device): the bytes the block pool may take, e.g. ``2GiB``.
* ``gpu_memory_utilization`` (CUDA): the fraction of the device this stage may use in all; the weights and
  the peak activations of a worst-case forward (profiled at start-up) come out of it, the rest is KV.
* neither: the configured ``num_blocks``.

A budget that cannot hold one request of ``max_model_len`` is refused at start-up with the figures.
"""

from __future__ import annotations

import torch

from omnistage.config.memory import format_bytes


class KVBudgetError(ValueError):
    """The memory given to a stage's KV cache cannot serve one request of its maximum length."""


def kv_block_bytes(spec: tuple[int, int, int], block_size: int, dtype: torch.dtype) -> int:
    """Bytes of one block across all layers: keys and values of ``block_size`` tokens."""
    num_layers, num_kv_heads, head_dim = spec
    return 2 * num_layers * block_size * num_kv_heads * head_dim * torch.finfo(dtype).bits // 8


def num_blocks_for_memory(spec: tuple[int, int, int], block_size: int, dtype: torch.dtype, budget_bytes: int) -> int:
    """How many KV blocks fit in ``budget_bytes``."""
    return max(budget_bytes // kv_block_bytes(spec, block_size, dtype), 0)


def blocks_for_budget(spec: tuple[int, int, int], block_size: int, dtype: torch.dtype, budget_bytes: int,
                      max_model_len: int) -> int:
    """Pool size (usable blocks + the null block) for ``budget_bytes``; refuses a budget below one full request."""
    per_block = kv_block_bytes(spec, block_size, dtype)
    usable = budget_bytes // per_block - 1  # one block is the null block
    needed = -(-max_model_len // block_size)
    if usable < needed:
        raise KVBudgetError(
            f"KV cache budget {format_bytes(max(budget_bytes, 0))} holds {max(usable, 0)} blocks of {block_size} "
            f"tokens ({format_bytes(per_block)} each), but one request of max_model_len={max_model_len} needs "
            f"{needed} ({format_bytes((needed + 1) * per_block)}): raise --kv-cache-memory or "
            f"--gpu-memory-utilization, or lower max_model_len")
    return usable + 1


def gpu_kv_budget(utilization: float, total: int, free: int, weights: int, activation_peak: int) -> int:
    """KV bytes for a stage allowed ``utilization`` of a device of ``total`` bytes (vLLM's rule).

    Its weights and the peak activations of a worst-case forward come out of its share; the result never
    exceeds what is free now less room for those activations (other processes may hold the rest).
    """
    if not 0.0 < utilization <= 1.0:
        raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {utilization}")
    share = int(total * utilization) - weights - activation_peak
    return max(min(share, free - activation_peak), 0)
