"""``omnistage verify`` on a Qwen3-ASR (or forced-aligner) folder: omnistage against transformers' ``qwen3_asr``.

Each case is a synthetic clip (a short one, and one longer than the encoder's attention window, so windowed
attention over several windows is compared) with the language left to the model or forced. The recogniser's
greedy tokens (omnistage's paged engine vs transformers' ``generate``) must be identical and its prompt logits
within ``TOLERANCE``; the aligner's per-row class logits over a prompt with ``<timestamp>`` markers within it.
transformers reads only the ``-hf`` layout, so a published-layout folder is refused here (its loading is tested
against the same tensors written both ways).
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from omnistage.engine import EngineConfig
from omnistage.families.qwen3_asr.config import Qwen3ASRCheckpoint
from omnistage.families.qwen3_asr.model import Qwen3ASR
from omnistage.families.qwen3_asr.prompt import ASRPromptIds, Qwen3ASRPromptProcessor
from omnistage.families.qwen3_asr.stage import build_request, whole_prompt_hidden
from omnistage.runner import build_ar_engine
from omnistage.sampling_params import SamplingParams
from omnistage.tools.verify.divergence import first_divergence

TOLERANCE = 1e-4  # fp32 on a CPU: ours and transformers' prompt logits differ by summation order only
NEW_TOKENS = 12
ALIGNED_TRANSCRIPT = "the quick brown fox jumps over the lazy dog"
CASES = {"short": (1.2, None), "short-en": (1.2, "en"), "long": (9.0, None)}  # seconds, forced language


def synthetic_clip(seconds: float, seed: int = 0) -> np.ndarray:
    """A voiced-sounding 16 kHz clip: a wandering pitch with harmonics, syllable-rate bursts and a little noise."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * 16000)) / 16000
    pitch = 140 + 30 * np.sin(2 * np.pi * 0.7 * t)
    phase = 2 * np.pi * np.cumsum(pitch) / 16000
    voiced = sum(np.sin(k * phase) / k for k in range(1, 6)) * (0.5 + 0.5 * np.sin(2 * np.pi * 4 * t) ** 2)
    return (0.2 * voiced + 0.01 * rng.standard_normal(t.shape)).astype(np.float32)


@dataclass(frozen=True)
class CaseReport:
    name: str
    prompt_tokens: int
    tokens_identical: bool
    logits_max_abs_diff: float
    detail: str = ""

    def ok(self, tolerance: float) -> bool:
        return self.tokens_identical and self.logits_max_abs_diff <= tolerance


def greedy_tokens(model: Qwen3ASR, prompt: ASRPromptIds, new_tokens: int) -> list[int]:
    """One prompt through the recogniser's paged engine, greedy."""
    request = build_request(model, "verify", prompt.token_ids, prompt.mels,
                            SamplingParams(temperature=0.0, max_tokens=new_tokens))
    length = prompt.num_tokens + new_tokens
    engine = build_ar_engine(model, EngineConfig(block_size=16, num_blocks=-(-length // 16) + 2, max_num_seqs=1,
                                                 max_num_batched_tokens=length, max_model_len=length,
                                                 enforce_eager=True))
    engine.add_request(request)
    engine.run_until_done()
    return list(request.output_token_ids)


def reference_inputs(processor: Qwen3ASRPromptProcessor, prompt: ASRPromptIds) -> dict[str, torch.Tensor]:
    """transformers' inputs for the same prompt: features padded to whole 100-frame chunks, with their mask."""
    mel = prompt.mels[0]
    chunk = processor.n_window * 2
    padded = -(-mel.shape[1] // chunk) * chunk
    features = torch.zeros(1, mel.shape[0], padded)
    features[0, :, :mel.shape[1]] = mel
    mask = torch.zeros(1, padded, dtype=torch.long)
    mask[0, :mel.shape[1]] = 1
    ids = torch.tensor([prompt.token_ids])
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "input_features": features,
            "input_features_mask": mask}


def verify_recogniser(folder: Path, case: str, new_tokens: int = NEW_TOKENS) -> CaseReport:
    from transformers import Qwen3ASRForConditionalGeneration

    ckpt = Qwen3ASRCheckpoint.from_folder(folder)
    model = Qwen3ASR.from_checkpoint(folder, ckpt=ckpt)
    processor = Qwen3ASRPromptProcessor(folder, int(ckpt.audio.n_window))
    seconds, language = CASES[case]
    prompt = processor.prompt(synthetic_clip(seconds), language)
    reference = Qwen3ASRForConditionalGeneration.from_pretrained(folder, dtype=torch.float32).eval()
    inputs = reference_inputs(processor, prompt)
    with torch.no_grad():
        theirs_logits = reference(**inputs).logits[0]
        out = reference.generate(**inputs, max_new_tokens=new_tokens, do_sample=False, output_scores=True,
                                 return_dict_in_generate=True, eos_token_id=list(ckpt.eos_token_ids))
    theirs = out.sequences[0, prompt.num_tokens:].tolist()
    ours = greedy_tokens(model, prompt, new_tokens)
    logits = model.compute_logits(whole_prompt_hidden(model, prompt.token_ids, prompt.mels))
    divergence = first_divergence(ours, theirs, [s[0] for s in out.scores])
    return CaseReport(case, prompt.num_tokens, ours == theirs, _max_abs_diff(logits, theirs_logits),
                      divergence.describe() if divergence else "")


def verify_aligner(folder: Path) -> CaseReport:
    """The aligner's class logits over an audio + words + markers prompt against transformers' token
    classification; its argmax classes identical."""
    from transformers import Qwen3ASRForTokenClassification

    from omnistage.families.qwen3_asr.aligner import ForcedAligner, split_words

    aligner = ForcedAligner(folder)
    prompt = aligner.prompt(synthetic_clip(3.0), split_words(ALIGNED_TRANSCRIPT))
    reference = Qwen3ASRForTokenClassification.from_pretrained(folder, dtype=torch.float32).eval()
    with torch.no_grad():
        theirs = reference(**reference_inputs(aligner.processor, prompt)).logits[0]
    ours = aligner.logits(prompt)
    same = ours.shape == theirs.shape and bool(torch.equal(ours.argmax(-1), theirs.argmax(-1)))
    return CaseReport("aligner", prompt.num_tokens, same, _max_abs_diff(ours, theirs))


def _max_abs_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).abs().max()) if a.shape == b.shape else float("inf")


def run_verify(args: argparse.Namespace, folder: Path) -> int:
    """The family's ``verify`` hook."""
    ckpt = Qwen3ASRCheckpoint.from_folder(folder)
    if ckpt.published:
        print("omnistage verify: transformers reads only the -hf layout of Qwen3-ASR; give that folder")
        return 2
    tolerance = getattr(args, "tolerance", TOLERANCE) or TOLERANCE
    if ckpt.aligner:
        reports = [verify_aligner(Path(folder))]
    else:
        reports = [verify_recogniser(Path(folder), case) for case in CASES]
    for r in reports:
        what = "argmax classes" if ckpt.aligner else "greedy tokens"
        print(f"[{r.name}] prompt {r.prompt_tokens} tokens: {what} "
              f"{'identical' if r.tokens_identical else 'DIFFER'}, logits max |diff| {r.logits_max_abs_diff:.2e} "
              f"({'within' if r.logits_max_abs_diff <= tolerance else 'OVER'} {tolerance:g})")
        if r.detail:
            print(f"  {r.detail}")
    return 0 if all(r.ok(tolerance) for r in reports) else 1
