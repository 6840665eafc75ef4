"""``omnistage bench quant``: a stage's decode with on-the-fly quantized weights against the same model
unquantized, in one run on one loaded model.

The stage is loaded once; batch-1 greedy decode is timed unquantized (best of ``repeats``), then the model's
linears and experts are quantized in place (:func:`omnistage.layers.quant.apply.apply_quantization`) and the
same requests are timed again. Decode time excludes the prefill step. Agreement is reported two ways over the
unquantized runs' ``output_len`` tokens for ``prompts`` random prompts: ``free_running`` (the quantized run's
own greedy tokens, position by position: one early flip changes everything after it) and ``teacher_forced``
(the quantized model's greedy choice after the unquantized prefix, at every position: a flip counts once).
``median_margin`` and ``margin_p10`` are the unquantized model's top-1 minus top-2 logit at those positions:
plain random checkpoints have far smaller margins than trained ones (their agreement understates a real
model's); ``make-tiny --confident-head`` writes one with a trained model's margins. ``--stage tts-talker``: Qwen3-TTS's
talker and code predictor (:mod:`omnistage.tools.bench.quant_tts`).
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from omnistage.engine import EngineConfig, EngineCore
from omnistage.layers.attention.base import AttentionMetadata
from omnistage.layers.attention.context import ForwardContext, forward_context
from omnistage.layers.quant.apply import apply_quantization
from omnistage.runner import ARModelRunner
from omnistage.runner.ar_runner import default_backend
from omnistage.sampling_params import SamplingParams
from omnistage.tools.bench.engine import StageUnderTest, load_stage


@dataclass
class DecodeRun:
    tokens_per_s: float
    step_ms: float
    weight_bytes: int
    tokens: list[int]


@dataclass
class QuantReport:
    model: str
    stage: str
    quantization: str
    dtype: str
    threads: int
    baseline: DecodeRun
    quantized: DecodeRun
    speedup: float
    prompts: int
    free_running_agreement: float
    teacher_forced_agreement: float
    median_margin: float
    margin_p10: float


def _config(prompt_len: int, output_len: int, device: str, dtype: torch.dtype) -> EngineConfig:
    blocks = -(-(prompt_len + output_len + 16) // 16) + 4
    return EngineConfig(block_size=16, num_blocks=blocks, max_num_seqs=1, max_num_batched_tokens=max(prompt_len, 256),
                        max_model_len=prompt_len + output_len + 16, enable_prefix_caching=False, device=device,
                        dtype=dtype)


def _decode(stage: StageUnderTest, config: EngineConfig, prompt_len: int, output_len: int,
            seed: int = 0) -> tuple[float, list[int], list[int]]:
    """(seconds of the decode steps after the prefill, the prompt, the greedy tokens) of one batch-1 request."""
    params = SamplingParams(temperature=0.0, max_tokens=output_len, ignore_eos=True)
    core = EngineCore(ARModelRunner(stage.model, config, hook=stage.make_hook()), config)
    request = stage.make_request(f"quant-{seed}", prompt_len, params, torch.Generator().manual_seed(seed))
    core.add_request(request)
    core.step()  # the prefill and the first token
    start = time.perf_counter()
    core.run_until_done()
    if config.device.startswith("cuda"):
        torch.cuda.synchronize()
    return time.perf_counter() - start, list(request.prompt_token_ids), list(request.output_token_ids)


def _timed_run(stage: StageUnderTest, config: EngineConfig, prompt_len: int, output_len: int,
               repeats: int) -> DecodeRun:
    _decode(stage, config, prompt_len, 4)  # warm-up: first-call allocations, stacked weights
    best, _, tokens = min(_decode(stage, config, prompt_len, output_len) for _ in range(repeats))
    weight_bytes = sum(t.numel() * t.element_size() for t in [*stage.model.parameters(), *stage.model.buffers()])
    steps = output_len - 1
    return DecodeRun(round(steps / best, 2), round(1000 * best / steps, 3), weight_bytes, tokens)


@torch.inference_mode()
def _sequence_logits(stage: StageUnderTest, ids: list[int], device: str) -> torch.Tensor:
    """``[L, vocab]``: the thinker's logits at every position of ``ids`` (one uncached pass)."""
    model = stage.model
    tensor = torch.tensor(ids, device=device)
    positions, _ = model.positions(tensor.cpu())
    meta = AttentionMetadata.for_fresh_sequences([len(ids)], torch.device(device))
    with forward_context(ForwardContext(meta, default_backend(torch.device(device)), None)):
        hidden = model(tensor, positions.to(device))
    return model.compute_logits(hidden).float()


@dataclass
class _Greedy:
    """One prompt's greedy reply and the logits that chose each of its tokens (teacher-forced on the
    unquantized reply)."""

    tokens: list[int]
    logits: torch.Tensor  # [output_len, vocab]


def _greedy_runs(stage: StageUnderTest, config: EngineConfig, prompt_len: int, output_len: int, prompts: int,
                 reference: list[_Greedy] | None, device: str) -> list[_Greedy]:
    """Prompt ``i`` (seed ``i``): the model's own greedy reply, and its logits along ``reference[i]``'s reply
    (its own when there is no reference)."""
    runs = []
    for seed in range(prompts):
        _, prompt, tokens = _decode(stage, config, prompt_len, output_len, seed)
        along = tokens if reference is None else reference[seed].tokens
        runs.append(_Greedy(tokens, _sequence_logits(stage, prompt + along, device)[prompt_len - 1:-1]))
    return runs


def _agreement(base: list[_Greedy], quant: list[_Greedy]) -> tuple[float, float, torch.Tensor]:
    """(free-running, teacher-forced) agreement over every position of every prompt, and the unquantized
    top-1 minus top-2 margins at those positions."""
    positions = sum(len(run.tokens) for run in base)
    free = sum(a == b for b_run, q_run in zip(base, quant) for a, b in zip(b_run.tokens, q_run.tokens))
    forced = sum(int((q_run.logits.argmax(-1).cpu() == torch.tensor(b_run.tokens)).sum())
                 for b_run, q_run in zip(base, quant))
    top2 = torch.cat([run.logits.topk(2, dim=-1).values.cpu() for run in base])
    return free / positions, forced / positions, top2[:, 0] - top2[:, 1]


def bench_quant(model: str, quantization: str, prompt_len: int, output_len: int, repeats: int, device: str,
                dtype: torch.dtype, prompts: int = 1) -> QuantReport:
    """Times prompt 0 (best of ``repeats``); agreement over ``prompts`` random prompts."""
    stage = load_stage(model, "thinker", device, dtype)
    config = _config(prompt_len, output_len, device, dtype)
    baseline = _timed_run(stage, config, prompt_len, output_len, repeats)
    base_runs = _greedy_runs(stage, config, prompt_len, output_len, prompts, None, device)
    apply_quantization(stage.model, quantization)
    quantized = _timed_run(stage, config, prompt_len, output_len, repeats)
    quant_runs = _greedy_runs(stage, config, prompt_len, output_len, prompts, base_runs, device)
    free, forced, margins = _agreement(base_runs, quant_runs)
    return QuantReport(str(model), "thinker", quantization, str(dtype).removeprefix("torch."), torch.get_num_threads(),
                       baseline, quantized, round(quantized.tokens_per_s / baseline.tokens_per_s, 3), prompts,
                       round(free, 4), round(forced, 4), round(float(margins.median()), 4),
                       round(float(margins.quantile(0.1)), 4))


def main(args: argparse.Namespace) -> int:
    torch.set_num_threads(args.threads)
    if args.stage == "tts-talker":
        return _main_tts(args)
    report = bench_quant(args.model, args.quantization, args.prompt_len, args.output_len, args.repeats,
                         args.device, getattr(torch, args.dtype), args.prompts)
    for name, run in (("unquantized", report.baseline), (report.quantization, report.quantized)):
        print(f"thinker {name:>11} ({report.dtype}, batch 1, {report.threads} threads): {run.tokens_per_s:8.2f} "
              f"tokens/s, {run.step_ms:8.2f} ms/step, weights {run.weight_bytes / 1e9:.2f} GB")
    print(f"speedup x{report.speedup:.2f}; greedy agreement over {report.prompts} prompts x "
          f"{len(report.baseline.tokens)} tokens: free-running {report.free_running_agreement:.1%}, teacher-forced "
          f"{report.teacher_forced_agreement:.1%} (unquantized top-1 minus top-2 logit: median "
          f"{report.median_margin:.3g}, 10th percentile {report.margin_p10:.3g})")
    if args.json_out:
        payload = asdict(report)
        Path(args.json_out).write_text(json.dumps(payload, indent=2))
    return 0


def _main_tts(args: argparse.Namespace) -> int:
    from omnistage.tools.bench.quant_tts import bench_quant_tts, print_report

    report = bench_quant_tts(args.model, args.quantization, args.prompt_len, args.output_len, args.prompts,
                             args.repeats, args.device, getattr(torch, args.dtype), args.confident)
    print_report(report)
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(asdict(report), indent=2))
    return 0
