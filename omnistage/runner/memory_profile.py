"""Sizing a runner's KV pool from its stage's memory budget (:mod:`omnistage.engine.kv_sizing`).

On CUDA with ``gpu_memory_utilization`` the runner first runs the largest
forward a step can ask for (``max_num_batched_tokens`` new tokens of one
sequence, no cache, then the logits of ``max_num_seqs`` rows) and records the
peak of allocated memory above the weights: what must stay free beside the KV
cache. Two reserves come out of the share too: what the process holds outside
torch's allocator (context, cuBLAS, Triton, NCCL) and an estimate of the decode
graphs' pool, which is captured only after the cache is allocated
(docs/memory_plan.md). A CPU stage given no budget gets vLLM's CPU default (engine/kv_sizing.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from omnistage.engine.kv_sizing import (
    KVPlan, available_memory, blocks_for_budget, check_cpu_budget, cpu_default_budget, gpu_kv_budget, graph_pool_bytes,
    kv_block_bytes, outside_torch_bytes,
)
from omnistage.layers.attention.base import AttentionMetadata
from omnistage.layers.attention.context import ForwardContext, forward_context
from omnistage.runner.cuda_graph import graph_batch_sizes

if TYPE_CHECKING:
    from omnistage.engine.config import EngineConfig
    from omnistage.runner.ar_runner import ARModelRunner


def kv_pool_plan(runner: ARModelRunner, spec: tuple[int, int, int], tensor_parallel: bool = False) -> KVPlan:
    """The runner's KV pool: its budget, blocks (the null block included) and the tokens they hold."""
    config = runner.config
    block_bytes = kv_block_bytes(spec, config.block_size, config.cache_dtype)
    per_block = block_bytes + runner.hook.slot_bytes(config) * config.block_size
    cpu = runner.device.type == "cpu"

    def plan(budget: int, source: str, blocks: int) -> KVPlan:
        return KVPlan(budget, source, blocks, config.block_size, block_bytes, config.cache_dtype)

    if config.kv_cache_memory:
        budget, source = config.kv_cache_memory, "--kv-cache-memory"
        if cpu:
            check_cpu_budget(budget, available_memory())
    elif config.gpu_memory_utilization and runner.device.type == "cuda":
        budget, source = cuda_kv_budget(runner, tensor_parallel), "gpu_memory_utilization"
    elif cpu:  # the configured count is the most blocks; the default budget may allow fewer
        budget = cpu_default_budget(available_memory())
        return plan(budget, "CPU default", max(min(config.num_blocks, budget // per_block), 2))
    else:
        return plan(0, "num_kv_blocks", config.num_blocks)
    blocks = blocks_for_budget(spec, config.block_size, config.cache_dtype, budget, config.max_model_len,
                               runner.hook.slot_bytes(config))
    return plan(budget, source, blocks)


def captured_sizes(runner: ARModelRunner, tensor_parallel: bool) -> list[int]:
    """The decode graph batch sizes the runner will capture after sizing (none when it runs eagerly)."""
    config = runner.config
    if config.enforce_eager or config.cuda_graph_max_batch <= 0 or tensor_parallel:
        return []
    return graph_batch_sizes(min(config.cuda_graph_max_batch, config.max_num_seqs))


def cuda_kv_budget(runner: ARModelRunner, tensor_parallel: bool) -> int:
    config = runner.config
    free, total = torch.cuda.mem_get_info(runner.device)
    weights = sum(t.numel() * t.element_size() for t in (*runner.model.parameters(), *runner.model.buffers()))
    peak = activation_peak(runner)
    pool = graph_pool_bytes(peak, profiled_tokens(config), captured_sizes(runner, tensor_parallel))
    return gpu_kv_budget(config.gpu_memory_utilization, total, free, weights, peak,
                         outside_torch_bytes(tensor_parallel), pool)


def profiled_tokens(config: EngineConfig) -> int:
    """Tokens of the worst-case forward :func:`activation_peak` runs."""
    return min(config.max_num_batched_tokens, config.max_model_len)


@torch.inference_mode()
def activation_peak(runner: ARModelRunner) -> int:
    """Bytes allocated at the peak of a worst-case forward beyond what was allocated before it (CUDA)."""
    config, device = runner.config, runner.device
    num_tokens = profiled_tokens(config)
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
