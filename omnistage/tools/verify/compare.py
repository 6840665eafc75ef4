"""Runs transformers and omnistage on the same prompts and measures how far apart they are.

The two sides may load different folders (``ours_folder``): prompts and the
reference always come from ``folder``, so a perturbed copy for omnistage shows
that a real difference is caught.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch

from omnistage.layers.attention import AttentionMetadata, ForwardContext, forward_context
from omnistage.models.qwen3_omni.prompt_media import encode_needed
from omnistage.models.qwen3_omni.thinker import Thinker
from omnistage.families.qwen3_omni.offline import GenerationSettings, OfflineOutput, StageModels, generate_offline
from omnistage.families.qwen3_omni.stages import build_thinker_request
from omnistage.families.qwen3_omni.thinker_hook import ThinkerRequestData
from omnistage.models.qwen3_omni.config import Qwen3OmniConfig
from omnistage.families.qwen3_omni.prompt import Qwen3OmniPromptProcessor
from omnistage.runner.ar_runner import default_backend
from omnistage.tools.verify.prompts import VerifyCase, build_cases
from omnistage.tools.verify.reference import Reference, StageResult, quiet_transformers
from omnistage.tools.verify.cases import CASE_NAMES, TOLERANCE  # noqa: F401 - re-exported


@dataclass(frozen=True)
class CaseReport:
    name: str
    prompt_tokens: int
    tokens_identical: bool
    logits_max_abs_diff: float
    codes_identical: bool
    wav_max_abs_diff: float  # inf when the lengths differ
    tokens: list[int]
    reference_tokens: list[int]
    frames: int
    reference_frames: int
    samples: int
    tolerance: float = TOLERANCE

    @property
    def ok(self) -> bool:
        return (self.tokens_identical and self.codes_identical and self.logits_max_abs_diff <= self.tolerance
                and self.wav_max_abs_diff <= self.tolerance)

    def to_json(self) -> dict[str, object]:
        finite = {k: (v if v == v and abs(v) != float("inf") else None)  # JSON has no inf/NaN
                  for k, v in (("logits_max_abs_diff", self.logits_max_abs_diff),
                               ("wav_max_abs_diff", self.wav_max_abs_diff))}
        return {"name": self.name, "ok": self.ok, "prompt_tokens": self.prompt_tokens,
                "tokens_identical": self.tokens_identical, "codes_identical": self.codes_identical, **finite,
                "tokens": self.tokens, "reference_tokens": self.reference_tokens, "frames": self.frames,
                "reference_frames": self.reference_frames, "samples": self.samples}


@dataclass(frozen=True)
class VerifyReport:
    model: str
    cases: list[CaseReport] = field(default_factory=list)
    tolerance: float = TOLERANCE
    tensor_parallel_size: int = 1  # omnistage's thinker, sharded over this many processes

    @property
    def ok(self) -> bool:
        return bool(self.cases) and all(case.ok for case in self.cases)

    def to_json(self) -> dict[str, object]:
        return {"model": self.model, "tolerance": self.tolerance, "tensor_parallel_size": self.tensor_parallel_size,
                "ok": self.ok, "cases": [case.to_json() for case in self.cases]}

    def dumps(self) -> str:
        return json.dumps(self.to_json(), indent=2)


def run_verify(
    folder: str | Path, *, ours_folder: str | Path | None = None, settings: GenerationSettings | None = None,
    cases: Sequence[str] | None = None, tolerance: float = TOLERANCE, tensor_parallel_size: int = 1,
) -> VerifyReport:
    """Greedy, fp32, CPU: transformers on ``folder`` against omnistage on ``ours_folder`` (default: the same), the
    thinker sharded over ``tensor_parallel_size`` processes (gloo)."""
    with quiet_transformers():
        return _run(Path(folder), Path(ours_folder or folder), settings or GenerationSettings(), cases, tolerance,
                    tensor_parallel_size)


def _run(folder: Path, ours_folder: Path, settings: GenerationSettings, cases: Sequence[str] | None,
         tolerance: float, tensor_parallel_size: int) -> VerifyReport:
    config = Qwen3OmniConfig.from_folder(folder)
    selected = [c for c in build_cases(Qwen3OmniPromptProcessor(folder, config.processor), config)
                if not cases or c.name in cases]
    if cases and len(selected) != len(set(cases)):
        raise ValueError(f"unknown case in {list(cases)}; known: {', '.join(CASE_NAMES)}")
    settings = _known_speaker(settings, config)
    reference = Reference(folder)
    models = StageModels.load(ours_folder, "cpu", torch.float32, tensor_parallel_size)
    eos = config.im_end_token_id
    reports = []
    try:
        for case in selected:
            theirs = reference.run(case, settings, eos)
            ours = generate_offline(models, case.prompt.token_ids, case.prompt.mm, settings)
            logits = prompt_logits(models.thinker, case, eos)
            reports.append(_compare(case, ours, logits, theirs, tolerance))
    finally:
        models.close()
    return VerifyReport(str(folder), reports, tolerance, tensor_parallel_size)


def _known_speaker(settings: GenerationSettings, config: Qwen3OmniConfig) -> GenerationSettings:
    """The settings' voice if the checkpoint has it, else its first voice (a user's checkpoint may name others).
    transformers looks voices up lower-cased, so only lower-case names are usable."""
    speakers = sorted(k for k in config.speakers if k == k.lower())
    if not speakers:
        raise ValueError("the checkpoint's talker_config has no (lower-case) speaker_id: no voice to speak with")
    return settings if settings.speaker.lower() in speakers else replace(settings, speaker=speakers[0])


@torch.no_grad()
def prompt_logits(thinker: Thinker, case: VerifyCase, eos: int) -> torch.Tensor:
    """``[L, vocab]`` over the prompt, from the very request the thinker engine is given (one uncached pass)."""
    request = build_thinker_request(thinker, "logits", case.prompt.token_ids, case.prompt.mm,
                                    GenerationSettings().thinker_params(), eos)
    device = next(thinker.parameters()).device
    ids = torch.tensor(request.prompt_token_ids, device=device)
    media = request.stage_data.media if isinstance(request.stage_data, ThinkerRequestData) else None
    if media is not None:  # the whole prompt, as the engine's first step encodes it
        encode_needed(thinker, [(media, 0, len(ids))])
    deepstack = media.deepstack(0, len(ids)) if media is not None else None
    meta = AttentionMetadata.for_fresh_sequences([len(ids)], device)
    with forward_context(ForwardContext(meta, default_backend(device), None)):
        hidden = thinker(ids, request.prompt_positions.to(device), request.prompt_embeds, deepstack)
    return thinker.compute_logits(hidden)


def _max_abs_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    if a.shape != b.shape:
        return float("inf")
    return float((a.float() - b.float()).abs().max()) if a.numel() else 0.0


def _compare(case: VerifyCase, ours: OfflineOutput, logits: torch.Tensor, theirs: StageResult,
             tolerance: float) -> CaseReport:
    return CaseReport(
        name=case.name, prompt_tokens=len(case.prompt.token_ids), tokens_identical=ours.tokens == theirs.tokens,
        logits_max_abs_diff=_max_abs_diff(logits, theirs.prompt_logits),
        codes_identical=ours.codes.shape == theirs.codes.shape and torch.equal(ours.codes, theirs.codes.cpu()),
        wav_max_abs_diff=_max_abs_diff(ours.wav, theirs.wav), tokens=ours.tokens, reference_tokens=theirs.tokens,
        frames=ours.codes.shape[-1], reference_frames=theirs.codes.shape[-1], samples=ours.wav.numel(),
        tolerance=tolerance,
    )


def format_table(report: VerifyReport) -> str:
    """A readable table: one row per case, then the verdict."""
    head = f"{'case':<12} {'prompt':>6}  {'tokens':<14} {'logits diff':>11}  {'frames':>6}  {'codes':<10} " \
           f"{'wav diff':>9}  result"
    tp = f"; thinker tensor-parallel over {report.tensor_parallel_size}" if report.tensor_parallel_size > 1 else ""
    lines = [f"omnistage verify: {report.model} (greedy, fp32, cpu; tolerance {report.tolerance:.0e}{tp})", head]
    for c in report.cases:
        tokens = f"{len(c.tokens)} {'identical' if c.tokens_identical else 'DIFFER'}"
        codes = "identical" if c.codes_identical else "DIFFER"
        frames = str(c.frames) if c.frames == c.reference_frames else f"{c.frames}/{c.reference_frames}"
        lines.append(f"{c.name:<12} {c.prompt_tokens:>6}  {tokens:<14} {c.logits_max_abs_diff:>11.2e}  "
                     f"{frames:>6}  {codes:<10} {c.wav_max_abs_diff:>9.2e}  {'ok' if c.ok else 'FAIL'}")
    lines.append("PASS" if report.ok else "FAIL")
    return "\n".join(lines)
