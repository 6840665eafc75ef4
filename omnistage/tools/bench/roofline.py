"""``omnistage bench roofline``: how far a decode step is from the memory floor.

Per batch size: the median wall time of a decode step of the stage's engine
(thinker: one token per request; talker: one codec frame per request, code
predictor included; code2wav: one chunk of codec frames per request); the
bytes that step must read (:mod:`omnistage.tools.bench.step_bytes`: each
selected expert once, dense weights once per call, embedding rows, the KV
cache); the machine's copy bandwidth, measured in the same run just before
and after each batch's steps; and ``floor_ratio`` = step time / (bytes /
bandwidth). 1.0 would be a step that only streams what it must read.

Beside it, the compute side of the roofline: the step's matmul FLOPs (counted with the bytes), the machine's
matmul rate measured in the same run (a large fp32/bf16 GEMM: near the best this CPU or GPU does), and
``roofline_ratio`` = step time / max(memory floor, compute floor). On a CPU a decode step at batch 16 of a wide
dense stack (the talker's code predictor: 15 passes over 80 M parameters) is bound by arithmetic, not bytes:
``floor_ratio`` then stays far above 1 while ``roofline_ratio`` shows how near the step is to what the cores
can do.

``--stage tts-predictor`` times Qwen3-TTS's code predictor alone (its 15 lockstep passes over one frame per
request, from random talker states), so the talker's and the predictor's floor ratios can be told apart (the
talker alone: ``tts-talker`` minus ``tts-predictor``, in time and in bytes). ``--quantization int8`` quantizes
the stage's decoder linears after loading, as serving's stage option does; their bytes are then counted at one
byte a weight.

Steps are timed without hooks (on CUDA through the decode CUDA graphs); the
bytes are counted over as many following steps, run eagerly with hooks (their
expert choice and context lengths are the same distribution), and averaged.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from omnistage.engine import EngineConfig, EngineCore
from omnistage.layers.quant.apply import apply_quantization
from omnistage.runner import ARModelRunner
from omnistage.runner.cuda_graph import describe
from omnistage.sampling_params import SamplingParams
from omnistage.tools.bench.engine import StageUnderTest, load_stage
from omnistage.tools.bench.step_bytes import ByteTally, StepBytes


@dataclass
class RooflineRow:
    stage: str
    batch: int
    step_ms: float
    bytes: int
    floor_ratio: float
    floor_ms: float
    bandwidth_gbps: float  # measured right before and after this row's timed steps (mean)
    step_ms_min: float
    weight_bytes: int
    expert_bytes: int
    kv_bytes: int
    active_experts_per_layer: float
    matmul_flops: int
    compute_floor_ms: float  # matmul FLOPs / the measured matmul rate
    roofline_ratio: float  # step time / max(floor_ms, compute_floor_ms)
    graphs: str = ""  # the timed engine's CUDA graphs: captured, failed (eager) or none asked for


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _best_seconds(run: Callable[[], object], device: str, repeats: int) -> float:
    """The fastest of ``repeats + 2`` synchronised runs (the first ones warm up, and rarely win)."""
    best = float("inf")
    for _ in range(repeats + 2):
        _sync(device)
        start = time.perf_counter()
        run()
        _sync(device)
        best = min(best, time.perf_counter() - start)
    return best


def copy_bandwidth(device: str, mib: int = 256, repeats: int = 8) -> float:
    """GB/s of ``y.copy_(x)`` on buffers far larger than any cache, counting the read and the write (best run)."""
    x = torch.ones(mib << 20, dtype=torch.uint8, device=device)
    y = torch.empty_like(x)
    return 2 * x.numel() / _best_seconds(lambda: y.copy_(x), device, repeats) / 1e9


def matmul_gflops(device: str, dtype: torch.dtype, repeats: int = 6) -> float:
    """GFLOP/s of a ``[256, 2048] x [2048, 2048]`` matmul (best run): what the device's GEMM reaches on a shape
    with plenty of rows."""
    a = torch.randn(256, 2048, device=device, dtype=dtype)
    b = torch.randn(2048, 2048, device=device, dtype=dtype)
    return 2 * 256 * 2048 * 2048 / _best_seconds(lambda: a @ b, device, repeats) / 1e9


@dataclass
class Timing:
    median_ms: float
    min_ms: float
    bandwidth_gbps: float
    graphs: str = ""


def _timed(step: Callable[[], object], steps: int, device: str) -> Timing:
    """Step times, with the copy bandwidth measured just before and after them: on a shared machine both move
    with the neighbours' load, and the ratio should compare like with like."""
    before = copy_bandwidth(device, repeats=4)
    times = []
    for _ in range(steps):
        _sync(device)
        start = time.perf_counter()
        step()
        _sync(device)
        times.append(time.perf_counter() - start)
    after = copy_bandwidth(device, repeats=4)
    return Timing(1000 * statistics.median(times), 1000 * min(times), (before + after) / 2)


def _counted(model: torch.nn.Module, step: Callable[[], object], steps: int) -> ByteTally:
    with StepBytes(model) as counter:
        for _ in range(steps):
            step()
    tally = counter.tally
    return ByteTally(tally.weights // steps, tally.experts // steps, tally.kv_cache // steps,
                     tally.embedding_rows // steps, tally.active_experts, tally.matmul_flops // steps)


def measure_ar(model_dir: str, stage_name: str, batches: list[int], steps: int, prompt_len: int, device: str,
               dtype: torch.dtype, quantization: str = "none") -> list[tuple[int, Timing, ByteTally]]:
    """(batch, step timing, bytes per step) for the thinker or the talker."""
    stage = load_stage(model_dir, stage_name, device, dtype)
    _quantize(stage.model, quantization)
    return measure_stage(stage, batches, steps, prompt_len, device, dtype)


def _quantize(model: object, quantization: str) -> None:
    from omnistage.models.qwen3_tts.checkpoint import quantize_talker_
    from omnistage.models.qwen3_tts.talker import Qwen3TTSTalker

    if isinstance(model, Qwen3TTSTalker):
        quantize_talker_(model, quantization)  # int8 or w8a8
    else:
        apply_quantization(model, quantization)  # type: ignore[arg-type]


def measure_tts_predictor(model_dir: str, batches: list[int], steps: int, device: str, dtype: torch.dtype,
                          quantization: str = "none") -> list[tuple[int, Timing, ByteTally]]:
    """Qwen3-TTS's code predictor alone: one frame's residual codes per request (greedy) from random talker
    states and first codes, its passes batched over the requests as the talker step runs them."""
    from omnistage.families.registry import resolve_model
    from omnistage.models.qwen3_tts.checkpoint import load_talker
    from omnistage.models.qwen3_tts.config import Qwen3TTSConfig

    folder = resolve_model(model_dir)
    talker = load_talker(folder, Qwen3TTSConfig.from_folder(folder), device, dtype, quantization)
    rows = []
    for batch in batches:
        gen = torch.Generator().manual_seed(batch)
        hidden = torch.randn(batch, talker.config.stack.hidden_size, generator=gen).to(device, dtype)
        code0 = torch.randint(0, talker.residual_vocab_size, (batch,), generator=gen).to(device)
        with torch.inference_mode():
            talker.predict_residual_codes(hidden, code0)  # warm-up: the workspace's caches and plans
            timing = _timed(lambda: talker.predict_residual_codes(hidden, code0), steps, device)
            tally = _counted(talker, lambda: talker.predict_residual_codes(hidden, code0), 1)
        rows.append((batch, timing, tally))
    return rows


def measure_stage(stage: StageUnderTest, batches: list[int], steps: int, prompt_len: int, device: str,
                  dtype: torch.dtype) -> list[tuple[int, Timing, ByteTally]]:
    """:func:`measure_ar` on a stage already built (scripts/gpu_check.py builds its stages in memory)."""
    rows = []
    for batch in batches:
        max_len = prompt_len + 2 * steps + 16
        config = EngineConfig(block_size=16, num_blocks=batch * (-(-max_len // 16)) + 8, max_num_seqs=batch,
                              max_num_batched_tokens=max(batch * prompt_len, 256), max_model_len=max_len,
                              enable_prefix_caching=False, device=device, dtype=dtype)
        core = EngineCore(ARModelRunner(stage.model, config, hook=stage.make_hook()), config)
        gen = torch.Generator().manual_seed(batch)
        params = SamplingParams(temperature=0.0, max_tokens=2 * steps + 8, ignore_eos=True)
        for i in range(batch):
            core.add_request(stage.make_request(f"roofline-{i}", prompt_len, params, gen))
        for _ in range(4):  # prefill (one step: the budget covers every prompt), then warm-up decodes
            core.step()
        timing = _timed(core.step, steps, device)
        timing.graphs = describe(core.runner.capture_outcomes)
        core.runner.graphs = None  # a graph replay runs no Python hooks: count the bytes on eager steps
        rows.append((batch, timing, _counted(stage.model, core.step, steps)))
        del core
    return rows


def measure_code2wav(model_dir: str, batches: list[int], steps: int, frames: int, device: str,
                     dtype: torch.dtype) -> list[tuple[int, Timing, ByteTally]]:
    """One chunk of ``frames`` codec frames per request (streaming chunk plus left context) per step."""
    from omnistage.families.registry import resolve_model
    from omnistage.models.qwen3_omni.code2wav import load_code2wav
    from omnistage.models.qwen3_omni.config import Qwen3OmniConfig

    folder = resolve_model(model_dir)
    model = load_code2wav(folder, Qwen3OmniConfig.from_folder(folder).code2wav, device, dtype)
    cfg = model.config
    rows = []
    for batch in batches:
        codes = torch.randint(0, cfg.codebook_size, (batch, cfg.num_quantizers, frames), device=device)
        with torch.inference_mode():
            model(codes)  # warm-up
            timing = _timed(lambda: model(codes), steps, device)
            tally = _counted(model, lambda: model(codes), 1)
        rows.append((batch, timing, tally))
    return rows


def roofline(args: argparse.Namespace) -> dict:
    dtype = getattr(torch, args.dtype)
    quantization = args.quantization
    if args.stage == "code2wav":
        measured = measure_code2wav(args.model, args.batch, args.steps, args.frames, args.device, dtype)
    elif args.stage == "tts-predictor":
        measured = measure_tts_predictor(args.model, args.batch, args.steps, args.device, dtype, quantization)
    else:
        measured = measure_ar(args.model, args.stage, args.batch, args.steps, args.prompt_len, args.device, dtype,
                              quantization)
    gflops = matmul_gflops(args.device, dtype)
    bandwidth = statistics.mean(t.bandwidth_gbps for _, t, _ in measured)
    return {"bandwidth_gbps": round(bandwidth, 2), "matmul_gflops": round(gflops, 1), "device": args.device,
            "dtype": args.dtype, "quantization": quantization, "threads": torch.get_num_threads(),
            "model": str(args.model), "results": [asdict(r) for r in roofline_rows(args.stage, measured, gflops)]}


def roofline_rows(stage: str, measured: list[tuple[int, Timing, ByteTally]], gflops: float) -> list[RooflineRow]:
    """Each batch's step time against its memory floor (bytes / bandwidth) and compute floor (FLOPs / rate)."""
    results = []
    for batch, timing, tally in measured:
        floor_ms = 1000 * tally.total / (timing.bandwidth_gbps * 1e9)
        compute_ms = 1000 * tally.matmul_flops / (gflops * 1e9)
        active = statistics.mean(tally.active_experts) if tally.active_experts else 0.0
        results.append(RooflineRow(stage, batch, round(timing.median_ms, 3), tally.total,
                                   round(timing.median_ms / floor_ms, 3), round(floor_ms, 3),
                                   round(timing.bandwidth_gbps, 2), round(timing.min_ms, 3),
                                   tally.weights + tally.embedding_rows, tally.experts, tally.kv_cache,
                                   round(active, 2), tally.matmul_flops, round(compute_ms, 3),
                                   round(timing.median_ms / max(floor_ms, compute_ms), 3), timing.graphs))
    return results


def main(args: argparse.Namespace) -> int:
    torch.set_num_threads(args.threads)
    report = roofline(args)
    print(f"copy bandwidth (mean): {report['bandwidth_gbps']:.1f} GB/s, matmul {report['matmul_gflops']:.1f} GFLOP/s "
          f"({args.device}, {args.dtype}, {report['threads']} threads)")
    for r in report["results"]:
        print(f"{r['stage']} batch {r['batch']:3d}: step {r['step_ms']:9.2f} ms (min {r['step_ms_min']:.2f}), "
              f"bandwidth {r['bandwidth_gbps']:.1f} GB/s, reads {r['bytes'] / 1e6:9.1f} MB "
              f"(experts {r['expert_bytes'] / 1e6:.1f}, dense {r['weight_bytes'] / 1e6:.1f}, "
              f"KV {r['kv_bytes'] / 1e6:.2f}; {r['active_experts_per_layer']:.1f} experts/layer) "
              f"-> floor {r['floor_ms']:.2f} ms, floor_ratio {r['floor_ratio']:.2f}; "
              f"{r['matmul_flops'] / 1e9:.2f} GFLOP -> compute floor {r['compute_floor_ms']:.2f} ms, "
              f"roofline_ratio {r['roofline_ratio']:.2f}")
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(report, indent=2))
    return 0
