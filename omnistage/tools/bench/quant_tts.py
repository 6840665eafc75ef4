"""``omnistage bench quant --stage tts-talker``: how often Qwen3-TTS's quantized talker and code predictor pick
another greedy code than the unquantized ones, and how much faster a frame is.

One loaded talker (made confident first unless ``--no-confident``: :mod:`omnistage.tools.confident_tts`). For
each random prompt the unquantized engine speaks ``frames`` greedy frames at batch 1, and every row it feeds the
talker (the prompt, then each frame's embedding plus its trailing text) is recorded. Both models are then
teacher-forced along those rows in one uncached pass each, so a flip counts once:

* ``code0_agreement``: the first codebook (the talker's head) at every frame;
* ``residual_agreement``: codebooks 1..15 from the code predictor, given the same talker state and the
  unquantized code 0 (within a frame a flipped code feeds the passes after it, as serving would);
* ``frames_identical``: frames whose 16 codes all agree.

The unquantized top-1 minus top-2 logits (first codebook, and every residual pass) are reported beside them:
agreement means little without them. Timing: a frame's decode step at batch 1 (best of ``repeats`` runs).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from omnistage.engine import EngineConfig, EngineCore
from omnistage.layers.attention.base import AttentionMetadata
from omnistage.layers.attention.context import ForwardContext, forward_context
from omnistage.models.qwen3_tts.checkpoint import quantize_talker_
from omnistage.models.qwen3_tts.talker import Qwen3TTSTalker
from omnistage.runner import ARModelRunner
from omnistage.runner.ar_runner import default_backend
from omnistage.sampling_params import SamplingParams
from omnistage.tools.bench.engine import StageUnderTest, load_stage
from omnistage.tools.confident_tts import confident_talker_


@dataclass
class TTSQuantReport:
    model: str
    quantization: str
    dtype: str
    threads: int
    confident: bool
    prompts: int
    frames: int
    frame_ms: float
    quantized_frame_ms: float
    speedup: float
    code0_agreement: float
    residual_agreement: float
    frames_identical: float
    code0_margin_median: float
    code0_margin_p10: float
    residual_margin_median: float
    residual_margin_p10: float


class _RecordingGreedy:
    """Greedy residual codes, keeping each pass's top-1 minus top-2 logit."""

    def __init__(self) -> None:
        self.margins: list[torch.Tensor] = []

    def sample(self, logits: torch.Tensor, step: int) -> torch.Tensor:
        top2 = logits.float().topk(2, dim=-1).values
        self.margins.append((top2[:, 0] - top2[:, 1]).cpu())
        return logits.argmax(dim=-1)


@dataclass
class _Forced:
    code0: torch.Tensor  # [F]
    residual: torch.Tensor  # [F, G - 1]
    code0_margins: torch.Tensor
    residual_margins: torch.Tensor


def _spoken_rows(stage: StageUnderTest, config: EngineConfig, prompt_len: int, frames: int,
                 seed: int) -> tuple[torch.Tensor, int]:
    """Every row the talker was fed while speaking one greedy request, and the prompt's length."""
    talker = stage.model
    assert isinstance(talker, Qwen3TTSTalker)
    rows: list[torch.Tensor] = []
    handle = talker.model.register_forward_pre_hook(lambda _m, args: rows.append(args[0].detach().clone()))
    try:
        params = SamplingParams(temperature=0.0, max_tokens=frames + 1, min_tokens=frames + 1, ignore_eos=True)
        core = EngineCore(ARModelRunner(talker, config, hook=stage.make_hook()), config)
        request = stage.make_request(f"quant-tts-{seed}", prompt_len, params, torch.Generator().manual_seed(seed))
        core.add_request(request)
        core.run_until_done()
    finally:
        handle.remove()
    return torch.cat(rows), request.num_prompt_tokens


@torch.inference_mode()
def _forced(talker: Qwen3TTSTalker, rows: torch.Tensor, prompt_len: int, code0: torch.Tensor | None) -> _Forced:
    """Codes along ``rows`` in one uncached pass: code 0 after the prompt and each frame row; the residual codes
    from those states and ``code0`` (the unquantized run's; its own greedy ones when None)."""
    device = rows.device
    meta = AttentionMetadata.for_fresh_sequences([rows.shape[0]], device)
    with forward_context(ForwardContext(meta, default_backend(device), None)):
        hidden = talker(None, torch.arange(rows.shape[0], device=device), inputs_embeds=rows)
    states = hidden[prompt_len - 1:]
    logits = talker.compute_logits(states).float()[:, :talker.residual_vocab_size]  # ordinary codes only
    top2 = logits.topk(2, dim=-1).values
    own = logits.argmax(dim=-1)
    sampler = _RecordingGreedy()
    codes = talker.predict_residual_codes(states, own if code0 is None else code0, sampler)
    return _Forced(own.cpu(), codes[:, 1:].cpu(), (top2[:, 0] - top2[:, 1]).cpu(), torch.cat(sampler.margins))


def _frame_ms(stage: StageUnderTest, config: EngineConfig, prompt_len: int, frames: int, repeats: int) -> float:
    """Best of ``repeats``: milliseconds per decode step (a frame) after the prefill, batch 1."""
    best = float("inf")
    for r in range(repeats + 1):  # the first run warms up
        params = SamplingParams(temperature=0.0, max_tokens=frames + 1, ignore_eos=True)
        core = EngineCore(ARModelRunner(stage.model, config, hook=stage.make_hook()), config)
        core.add_request(stage.make_request(f"time-{r}", prompt_len, params, torch.Generator().manual_seed(0)))
        core.step()
        start = time.perf_counter()
        core.run_until_done()
        best = min(best, (time.perf_counter() - start) / frames) if r else best
    return 1000 * best


def _share(a: torch.Tensor, b: torch.Tensor) -> float:
    return round(float((a == b).float().mean()), 4)


def bench_quant_tts(model: str, quantization: str, prompt_len: int, frames: int, prompts: int, repeats: int,
                    device: str, dtype: torch.dtype, confident: bool = True) -> TTSQuantReport:
    stage = load_stage(model, "tts-talker", device, dtype)
    talker = stage.model
    assert isinstance(talker, Qwen3TTSTalker)
    if confident:
        confident_talker_(talker)
    config = EngineConfig(block_size=16, num_blocks=-(-(prompt_len + frames + 64) // 16) + 4, max_num_seqs=1,
                          max_num_batched_tokens=max(prompt_len + 64, 256), max_model_len=prompt_len + frames + 64,
                          enable_prefix_caching=False, device=device, dtype=dtype)
    spoken = [_spoken_rows(stage, config, prompt_len, frames, seed) for seed in range(prompts)]
    base = [_forced(talker, rows, n, None) for rows, n in spoken]
    base_ms = _frame_ms(stage, config, prompt_len, frames, repeats)
    quantize_talker_(talker, quantization)
    quant = [_forced(talker, rows, n, b.code0) for (rows, n), b in zip(spoken, base)]
    quant_ms = _frame_ms(stage, config, prompt_len, frames, repeats)
    cat = lambda runs, name: torch.cat([getattr(r, name) for r in runs])  # noqa: E731
    same = torch.cat([(b.code0 == q.code0) & (b.residual == q.residual).all(dim=1) for b, q in zip(base, quant)])
    c0m, rm = cat(base, "code0_margins"), cat(base, "residual_margins")
    return TTSQuantReport(
        str(model), quantization, str(dtype).removeprefix("torch."), torch.get_num_threads(), confident, prompts,
        int(same.numel()), round(base_ms, 2), round(quant_ms, 2), round(base_ms / quant_ms, 3),
        _share(cat(base, "code0"), cat(quant, "code0")), _share(cat(base, "residual"), cat(quant, "residual")),
        round(float(same.float().mean()), 4), round(float(c0m.median()), 3), round(float(c0m.quantile(0.1)), 3),
        round(float(rm.median()), 3), round(float(rm.quantile(0.1)), 3))


def print_report(report: TTSQuantReport) -> None:
    print(f"tts-talker frame at batch 1 ({report.dtype}, {report.threads} threads): unquantized "
          f"{report.frame_ms:.1f} ms, {report.quantization} {report.quantized_frame_ms:.1f} ms (x{report.speedup:.2f})")
    print(f"teacher-forced greedy agreement over {report.prompts} prompts, {report.frames} frames "
          f"({'confident' if report.confident else 'plain random'} heads): code 0 {report.code0_agreement:.1%}, "
          f"codes 1-15 {report.residual_agreement:.1%}, whole frames {report.frames_identical:.1%}")
    print(f"unquantized top-1 minus top-2 logit: code 0 median {report.code0_margin_median:.3g} "
          f"(p10 {report.code0_margin_p10:.3g}); codes 1-15 median {report.residual_margin_median:.3g} "
          f"(p10 {report.residual_margin_p10:.3g})")
