"""``omnistage bench engine --context-lens 32,2048``: one stage engine's decode step as its contexts grow.

``batch`` requests start from a short random prompt and decode side by side (EOS ignored), as a conversation's
turns grow a context: their blocks are allocated step by step, interleaved, exactly as serving allocates them.
When the contexts reach each asked length, ``steps`` engine steps (schedule, forward, sample) are timed and the
median kept; the best of ``repeats`` runs is reported. A flat engine's step barely grows from 32 to 2,048 tokens.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from omnistage.engine import EngineConfig, EngineCore
from omnistage.engine.config import kv_cache_dtype_named
from omnistage.runner import ARModelRunner
from omnistage.sampling_params import SamplingParams
from omnistage.tools.bench.engine import StageUnderTest, load_stage


def context_config(batch: int, top: int, device: str, dtype: torch.dtype,
                   kv_cache_dtype: torch.dtype | None = None) -> EngineConfig:
    """A pool with room for ``batch`` contexts of ``top`` tokens and a few spare blocks (no prefix caching:
    random prompts share nothing)."""
    return EngineConfig(block_size=16, num_blocks=batch * (-(-top // 16) + 1) + 8, max_num_seqs=batch,
                        max_num_batched_tokens=max(batch * 16, 256), max_model_len=top, enable_prefix_caching=False,
                        device=device, dtype=dtype, kv_cache_dtype=kv_cache_dtype)


def _one_run(stage: StageUnderTest, config: EngineConfig, batch: int, context_lens: list[int], prompt_len: int,
             steps: int, seed: int) -> dict[int, float]:
    gen = torch.Generator().manual_seed(seed)
    params = SamplingParams(temperature=0.0, max_tokens=config.max_model_len - prompt_len, ignore_eos=True)
    core = EngineCore(ARModelRunner(stage.model, config, hook=stage.make_hook()), config)
    requests = [stage.make_request(f"ctx-{i}", prompt_len, params, gen) for i in range(batch)]
    for request in requests:
        core.add_request(request)
    step_ms: dict[int, float] = {}
    for length in context_lens:
        while min(r.num_tokens for r in requests) < length:
            core.step()
        times = []
        for _ in range(steps):
            start = time.perf_counter()
            core.step()
            if config.device.startswith("cuda"):
                torch.cuda.synchronize()
            times.append(time.perf_counter() - start)
        step_ms[length] = statistics.median(times) * 1e3
    return step_ms


def bench_context(stage: StageUnderTest, batch: int, context_lens: list[int], prompt_len: int = 16, steps: int = 8,
                  repeats: int = 2, device: str = "cpu", dtype: torch.dtype = torch.float32,
                  kv_cache_dtype: torch.dtype | None = None) -> dict[int, float]:
    """Milliseconds of one decode step of ``batch`` requests at each context length (best of ``repeats``)."""
    lengths = sorted(set(context_lens))
    if lengths[0] <= prompt_len:
        raise ValueError(f"context lengths must exceed the prompt ({prompt_len} tokens), got {lengths[0]}")
    config = context_config(batch, lengths[-1] + steps + 1, device, dtype, kv_cache_dtype)
    _one_run(stage, config, 2, [prompt_len + 2], prompt_len, 2, seed=0)  # warm-up: lazy inits, first calls
    runs = [_one_run(stage, config, batch, lengths, prompt_len, steps, seed) for seed in range(repeats)]
    return {length: min(run[length] for run in runs) for length in lengths}


def main(args: argparse.Namespace) -> int:
    torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype)
    stage = load_stage(args.model, args.stage, args.device, dtype)
    kv_dtype = kv_cache_dtype_named(args.kv_cache_dtype)
    payload: dict[str, object] = {"stage": args.stage, "model": str(args.model), "threads": args.threads,
                                  "kv_cache_dtype": args.kv_cache_dtype}
    for batch in args.batch:
        step_ms = bench_context(stage, batch, args.context_lens, args.prompt_len, args.steps, args.repeats,
                                args.device, dtype, kv_dtype)
        first = min(step_ms)
        for length, ms in step_ms.items():
            print(f"{args.stage} batch {batch:4d} context {length:6d}: {ms:8.3f} ms/step "
                  f"(x{ms / step_ms[first]:.2f} vs context {first})")
        # JSON keys are strings: the context length in tokens.
        payload.setdefault("batches", []).append({"batch": batch, "step_ms": {str(k): v for k, v in step_ms.items()}})
    runs = payload["batches"]
    payload["batch"], payload["step_ms"] = runs[-1]["batch"], runs[-1]["step_ms"]  # the (last) batch asked
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(payload, indent=2))
    return 0
