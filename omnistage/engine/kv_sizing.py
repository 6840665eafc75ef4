"""How many KV blocks a stage gets, from a memory budget, as vLLM sizes its cache.

* ``kv_cache_memory`` (any device): the bytes the block pool may take, e.g. ``2GiB``.
* ``gpu_memory_utilization`` (CUDA): the fraction of the device this stage may use in all; the weights, the
  peak activations of a worst-case forward (profiled at start-up), what torch's allocator does not count (the
  CUDA context, cuBLAS and Triton's modules, NCCL's buffers on a tensor-parallel rank) and the decode CUDA
  graphs' pool (captured after the KV cache) come out of it, the rest is KV. docs/memory_plan.md explains the figures.
* neither, on a CPU: vLLM's CPU default, 4 GiB (never more than half the memory available at start-up), and never
  more blocks than the configured ``num_blocks``; if that holds less than one request of ``max_model_len``, the
  longest context is what it holds (logged), not a refusal.
* neither, on CUDA: the configured ``num_blocks``.

A budget the user gave that cannot hold one request of ``max_model_len``, or (CPU) that is more than the memory
available, is refused at start-up with the figures.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from omnistage.config.memory import CPU_DEFAULT_KV_BYTES, format_bytes


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
                      max_model_len: int, slot_bytes: int = 0) -> int:
    """Pool size (usable blocks + the null block) for ``budget_bytes``; refuses a budget below one full request.
    ``slot_bytes``: what the stage keeps beside the KV per slot (a thinker's hidden rows), counted in each block."""
    per_block = kv_block_bytes(spec, block_size, dtype) + slot_bytes * block_size
    usable = budget_bytes // per_block - 1  # one block is the null block
    needed = -(-max_model_len // block_size)
    if usable < needed:
        raise KVBudgetError(
            f"KV cache budget {format_bytes(max(budget_bytes, 0))} holds {max(usable, 0)} blocks of {block_size} "
            f"tokens ({format_bytes(per_block)} each), but one request of max_model_len={max_model_len} needs "
            f"{needed} ({format_bytes((needed + 1) * per_block)}): raise --kv-cache-memory or "
            f"--gpu-memory-utilization, or lower max_model_len")
    return usable + 1


MIB = 1 << 20
# Memory a CUDA process holds outside torch's allocator counts: the context and the kernel images loaded into it
# (CUDA's lazy loading keeps this to a few hundred MiB on Hopper), cuBLAS/cuBLASLt handles, Triton's modules.
CUDA_CONTEXT_BYTES = 1024 * MIB
# A tensor-parallel rank's NCCL communicator: its channels' buffers, outside torch's allocator.
NCCL_BYTES = 512 * MIB
# Per captured batch size: the graph's kept output and the allocator's segment rounding in the graphs' pool.
GRAPH_SEGMENT_BYTES = 2 * MIB


def graph_pool_bytes(activation_peak: int, profiled_tokens: int, graph_sizes: list[int]) -> int:
    """An estimate of the decode graphs' shared pool: the largest captured batch's share of the profiled
    activations (a decode row's activations are a prefill token's: both scale with tokens; the paged kernels
    allocate nothing per context), plus one segment per captured size."""
    if not graph_sizes:
        return 0
    return -(-activation_peak * max(graph_sizes) // max(profiled_tokens, 1)) + len(graph_sizes) * GRAPH_SEGMENT_BYTES


def outside_torch_bytes(tensor_parallel: bool) -> int:
    """Bytes a CUDA stage holds outside torch's allocator counts: the context, and NCCL's on a sharded stage."""
    return CUDA_CONTEXT_BYTES + (NCCL_BYTES if tensor_parallel else 0)


def gpu_kv_budget(utilization: float, total: int, free: int, weights: int, activation_peak: int,
                  outside_torch: int = 0, graph_pool: int = 0) -> int:
    """KV bytes for a stage allowed ``utilization`` of a device of ``total`` bytes (vLLM's rule, with reserves).

    Its weights, the peak activations of a worst-case forward, what it holds outside torch's allocator
    (:func:`outside_torch_bytes`) and the decode graphs' pool still to be captured (:func:`graph_pool_bytes`)
    come out of its share. The result never exceeds what is free now less room for the activations and that
    pool (other processes may hold the rest; ``free`` already lacks this process's context).
    """
    if not 0.0 < utilization <= 1.0:
        raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {utilization}")
    share = int(total * utilization) - weights - activation_peak - outside_torch - graph_pool
    return max(min(share, free - activation_peak - graph_pool), 0)


# The default leaves the rest of what is available to the weights, the activations and the other stages.
CPU_DEFAULT_SHARE = 0.5


def available_memory() -> int:
    """Bytes the kernel says can be allocated without swapping (Linux ``MemAvailable``; else the free pages)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


@dataclass(frozen=True)
class KVPlan:
    """What a stage's KV pool got: its budget and where that came from, its blocks (the null block included) and
    the tokens they hold; :meth:`describe` is the start-up log line."""

    budget: int  # bytes the pool may take (0: a fixed block count was configured)
    source: str  # "--kv-cache-memory", "gpu_memory_utilization", "CPU default" or "num_kv_blocks"
    num_blocks: int
    block_size: int
    block_bytes: int
    dtype: torch.dtype

    @property
    def tokens(self) -> int:
        return (self.num_blocks - 1) * self.block_size

    @property
    def pool_bytes(self) -> int:
        return self.num_blocks * self.block_bytes

    def describe(self) -> str:
        budget = f"budget {format_bytes(self.budget)} ({self.source})" if self.budget else self.source
        return (f"KV cache: {budget}; {self.num_blocks - 1} blocks of {self.block_size} tokens = {self.tokens} "
                f"tokens, {format_bytes(self.pool_bytes)} in {str(self.dtype).removeprefix('torch.')}")


def cpu_default_budget(available: int) -> int:
    """The KV budget of a CPU stage given none: 4 GiB, or half the available memory when that is less."""
    return min(CPU_DEFAULT_KV_BYTES, int(available * CPU_DEFAULT_SHARE))


def check_cpu_budget(budget: int, available: int) -> None:
    """A CPU budget the user gave must fit in the memory available now."""
    if budget > available:
        raise KVBudgetError(f"KV cache budget {format_bytes(budget)} is more than this machine's available "
                            f"memory ({format_bytes(available)}): lower --kv-cache-memory")
