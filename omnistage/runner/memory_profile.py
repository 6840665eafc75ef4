"""Sizing a runner's KV pool from its stage's memory budget (:mod:`omnistage.engine.kv_sizing`).

On CUDA with ``gpu_memory_utilization`` the runner first runs the largest
forward a step can ask for (``max_num_batched_tokens`` new tokens of one
sequence, no cache, then the logits of ``max_num_seqs`` rows) and records the
peak of allocated memory above the weights: what must stay free beside the KV
cache.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from omnistage.engine.kv_sizing import blocks_for_budget, gpu_kv_budget
from omnistage.layers.attention.base import AttentionMetadata
from omnistage.layers.attention.context import ForwardContext, forward_context

if TYPE_CHECKING:
    from omnistage.runner.ar_runner import ARModelRunner


def kv_pool_blocks(runner: ARModelRunner, spec: tuple[int, int, int]) -> int:
    """Blocks (the null block included) for the runner's KV pool."""
    config = runner.config
    if config.kv_cache_memory:
        budget = config.kv_cache_memory
    elif config.gpu_memory_utilization and runner.device.type == "cuda":
        free, total = torch.cuda.mem_get_info(runner.device)
        weights = sum(t.numel() * t.element_size() for t in (*runner.model.parameters(), *runner.model.buffers()))
        budget = gpu_kv_budget(config.gpu_memory_utilization, total, free, weights, activation_peak(runner))
    else:
        return config.num_blocks
    return blocks_for_budget(spec, config.block_size, config.dtype, budget, config.max_model_len)


@torch.inference_mode()
def activation_peak(runner: ARModelRunner) -> int:
    """Bytes allocated at the peak of a worst-case forward beyond what was allocated before it (CUDA)."""
    config, device = runner.config, runner.device
    num_tokens = min(config.max_num_batched_tokens, config.max_model_len)
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    before = torch.cuda.memory_allocated(device)
    ids = torch.zeros(num_tokens, dtype=torch.int64, device=device)
    positions = torch.arange(num_tokens, device=device)
    if runner.mrope:
        positions = positions.expand(3, -1)
    meta = AttentionMetadata.for_fresh_sequences([num_tokens], device)
    with forward_context(ForwardContext(meta, runner.backend, None)):
        hidden = runner.model.forward(ids, positions, runner.model.embed_tokens(ids))
        runner.model.compute_logits(hidden[: config.max_num_seqs])
    torch.cuda.synchronize(device)
    peak = torch.cuda.max_memory_allocated(device) - before
    torch.cuda.empty_cache()
    return peak
