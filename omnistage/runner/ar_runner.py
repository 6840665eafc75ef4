"""The autoregressive stage runner: one scheduled step in, one sampled token per finished row out.

Start-up order (nano-vllm's): size the paged KV cache (from a memory budget,
profiling a worst-case forward on CUDA) and allocate it → build persistent
buffers → capture decode CUDA graphs (CUDA only). Each step: prepare inputs
from the scheduler's plan → the hook fills prompt rows it makes lazily (the
thinker's encoder features) → forward (graph replay for decode-only batches of
a captured size, eager otherwise) → logits of the rows that reached their last
token → stage hook → batched sampling → stage hook's extras.
"""

from __future__ import annotations

import logging
import math
import mmap

import torch

from omnistage.engine.config import EngineConfig
from omnistage.engine.engine_core import EngineCore
from omnistage.engine.kv_sizing import KVPlan
from omnistage.engine.outputs import ModelRunnerOutput, SchedulerOutput
from omnistage.engine.request import Request
from omnistage.layers.attention.base import AttentionBackend
from omnistage.layers.attention.context import ForwardContext, forward_context
from omnistage.runner.base import ARModel, model_uses_mrope
from omnistage.runner.cuda_graph import CaptureOutcome, CudaGraphRunner
from omnistage.runner.device import bind_device
from omnistage.runner.input_batch import InputBatch, StepInputs
from omnistage.runner.memory_profile import kv_pool_plan
from omnistage.engine.logprobs import TokenLogprob
from omnistage.runner.sampler import SampledTokens, Sampler
from omnistage.runner.step_hook import StepHook
from omnistage.runner.tp_executor import TPExecutor

logger = logging.getLogger(__name__)


def default_backend(device: torch.device, block_size: int = 16) -> AttentionBackend:
    """CUDA: the Triton paged kernel (tl.dot wants blocks of 16+ rows, a power of two), else torch SDPA over a
    gathered context; elsewhere: torch, decode reading the cache in place."""
    if device.type == "cuda":
        from omnistage.layers.attention import triton_paged

        if triton_paged.AVAILABLE and block_size >= 16 and block_size & (block_size - 1) == 0:
            return triton_paged.TritonPagedBackend()
        from omnistage.layers.attention.torch_sdpa_cuda import CudaSDPABackend

        return CudaSDPABackend()
    from omnistage.layers.attention.torch_sdpa import TorchSDPABackend

    return TorchSDPABackend()


def allocate_kv_caches(spec: tuple[int, int, int], config: EngineConfig, num_blocks: int) -> list[torch.Tensor]:
    """One ``[2, num_blocks, block_size, num_kv_heads, head_dim]`` cache per attention layer; on a CPU in memory
    the OS maps on first write (:func:`lazily_zeroed`)."""
    num_layers, num_kv_heads, head_dim = spec
    shape = (2, num_blocks, config.block_size, num_kv_heads, head_dim)
    if torch.device(config.device).type == "cpu":
        return [lazily_zeroed(shape, config.cache_dtype) for _ in range(num_layers)]
    return [torch.zeros(shape, dtype=config.cache_dtype, device=config.device) for _ in range(num_layers)]


def lazily_zeroed(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """A zero tensor in an anonymous mapping: its pages read as zeros and take memory only once written, so a KV
    pool sized from a budget costs the process the blocks its requests have used, not the whole budget
    (``torch.zeros`` writes every page). The tensor keeps the mapping alive."""
    count = math.prod(shape)
    buffer = mmap.mmap(-1, max(count * dtype.itemsize, 1))
    if hasattr(mmap, "MADV_HUGEPAGE"):  # where THP is "madvise": decode reads every block, fewer TLB misses
        buffer.madvise(mmap.MADV_HUGEPAGE)
    return torch.frombuffer(buffer, dtype=dtype, count=count).view(shape)


def check_kv_dtype(config: EngineConfig, tensor_parallel: bool) -> None:
    """A KV cache in another dtype than the model's is read by the CPU's torch attention only."""
    if config.cache_dtype != config.dtype and (torch.device(config.device).type != "cpu" or tensor_parallel):
        raise ValueError(f"kv_cache_dtype {str(config.cache_dtype).removeprefix('torch.')} differs from the model's "
                         f"dtype: a CPU stage without tensor parallelism only")


def log_kv_plan(plan: KVPlan, max_model_len: int) -> None:
    logger.info("%s", plan.describe())
    if plan.tokens < max_model_len:
        logger.warning("the KV cache holds %d tokens, less than max_model_len (%d): contexts stop there; raise "
                       "--kv-cache-memory or use --kv-cache-dtype bfloat16", plan.tokens, max_model_len)


class ARModelRunner:
    def __init__(
        self, model: ARModel, config: EngineConfig, hook: StepHook | None = None,
        backend: AttentionBackend | None = None, tp: TPExecutor | None = None,
    ) -> None:
        """``tp``: the stage's tensor-parallel group when ``model`` holds rank 0's shards (its other ranks then
        allocate KV caches of the same blocks, and decode runs eagerly)."""
        self.model = model
        self.config = config
        self.device = torch.device(config.device)
        bind_device(self.device)  # before the hook's and our own captures, and every launch after them
        self.hook = hook or StepHook()
        self.hook.bind(config)
        self.backend = backend or default_backend(self.device, config.block_size)
        self.mrope = model_uses_mrope(model)
        spec = tuple(model.kv_cache_spec())
        check_kv_dtype(config, tp is not None)
        self.kv_plan = kv_pool_plan(self, spec, tensor_parallel=tp is not None)
        self.num_blocks = self.kv_plan.num_blocks
        log_kv_plan(self.kv_plan, config.max_model_len)
        self.hook.bind_pool(self.num_blocks)
        self.kv_caches = allocate_kv_caches(spec, config, self.num_blocks)
        self.kv_block_bytes = self.kv_plan.block_bytes
        if tp is not None:
            tp.allocate_kv(self.num_blocks, config.block_size)
        self.batch = InputBatch(config, self.mrope, self.device, self.hook.feeds_output_embeds)
        self.sampler = Sampler()
        self.graphs: CudaGraphRunner | None = None
        self.capture_outcomes: tuple[CaptureOutcome, ...] = self.hook.capture_outcomes
        if self.device.type == "cuda" and not config.enforce_eager and config.cuda_graph_max_batch > 0 and tp is None:
            self.graphs, outcome = CudaGraphRunner.try_capture(self)
            self.capture_outcomes += (outcome,)

    def is_ready(self, request: Request) -> bool:
        return self.hook.is_ready(request)

    @torch.inference_mode()
    def execute_model(self, sched: SchedulerOutput) -> ModelRunnerOutput:
        if sched.is_empty:
            self.batch.drop(sched)
            return ModelRunnerOutput([])
        inputs = self.batch.prepare(sched)
        self.hook.prepare(self.model, inputs)
        hidden = self.forward(inputs, self.input_embeds(inputs))
        tokens = [-1] * len(sched.scheduled)
        requests = inputs.sample_requests
        if not requests:
            return ModelRunnerOutput(tokens)
        hidden_last = hidden[inputs.logits_indices]
        logits = self.hook.process_logits(self.model.compute_logits(hidden_last), requests)
        sampling = self.batch.sampling_batch(inputs, logits.shape[-1])
        sampled = self.sampler.sample_checked(logits, sampling)
        token_ids = sampled.token_ids
        self.batch.record_sampled(requests, token_ids)
        extra = self.hook.on_sampled(hidden_last, token_ids, requests, self.sampler, sampling)
        for row, token in zip(inputs.sample_rows, token_ids.tolist()):
            tokens[row] = token
        failed = tuple(row for row, bad in zip(inputs.sample_rows, sampled.bad.tolist()) if bad)
        return ModelRunnerOutput(tokens, extra, failed, token_logprobs(sampled, inputs.sample_rows, token_ids))

    def input_embeds(self, inputs: StepInputs) -> torch.Tensor | None:
        """Embeddings for the whole flat batch when any row is fed by embedding, else None (ids only)."""
        if not inputs.embed_prompt and not inputs.embed_outputs:
            return None
        embeds = self.model.embed_tokens(inputs.input_ids)
        for t, request, start, end in inputs.embed_prompt:
            embeds[t:t + end - start] = request.prompt_embeds[start:end].to(embeds.device, embeds.dtype)
        if inputs.embed_outputs:
            made = self.hook.output_embeds([span for _, span in inputs.embed_outputs])
            index = [t + j for t, span in inputs.embed_outputs for j in range(span.end - span.start)]
            rows = torch.tensor(index, dtype=torch.int64, device=embeds.device)
            embeds.index_copy_(0, rows, made.to(embeds.dtype))
        return embeds

    def forward(self, inputs: StepInputs, embeds: torch.Tensor | None) -> torch.Tensor:
        if self.graphs is not None and self.graphs.can_run(inputs, embeds):
            return self.graphs.run(inputs, embeds)
        with forward_context(ForwardContext(inputs.meta, self.backend, self.kv_caches)):
            return self.hook.forward(self.model, inputs, embeds)


def token_logprobs(sampled: SampledTokens, sample_rows: list[int], token_ids: torch.Tensor,
                   ) -> dict[int, TokenLogprob] | None:
    """The rows that asked for log-probabilities, by scheduled row (one host copy per tensor)."""
    lp = sampled.logprobs
    if lp is None:
        return None
    ids, values = lp.top_ids.tolist(), lp.top_logprobs.tolist()
    chosen, tokens = lp.sampled.tolist(), token_ids.tolist()
    return {sample_rows[r]: TokenLogprob(tokens[r], chosen[i], tuple(zip(ids[i], values[i])))
            for i, r in enumerate(lp.rows)}


def build_ar_engine(
    model: ARModel, config: EngineConfig, hook: StepHook | None = None, backend: AttentionBackend | None = None,
    tp: TPExecutor | None = None,
) -> EngineCore:
    """An autoregressive stage's engine: the runner sizes the KV cache, the core mirrors it."""
    return EngineCore(ARModelRunner(model, config, hook=hook, backend=backend, tp=tp), config)
