"""``omnistage verify`` on a forced aligner: per-row class logits against transformers'
``Qwen3ASRForTokenClassification`` on one clip and transcript, within ``verify.TOLERANCE``."""

from __future__ import annotations

from pathlib import Path

import torch

from omnistage.families.qwen3_asr.aligner import ForcedAligner, split_words
from omnistage.families.qwen3_asr.verify import CaseReport, reference_inputs, synthetic_clip

TRANSCRIPT = "the quick brown fox jumps over the lazy dog"


def verify_aligner(folder: Path) -> CaseReport:
    from transformers import Qwen3ASRForTokenClassification

    aligner = ForcedAligner(folder)
    prompt = aligner.prompt(synthetic_clip(3.0), split_words(TRANSCRIPT))
    reference = Qwen3ASRForTokenClassification.from_pretrained(folder, dtype=torch.float32).eval()
    with torch.no_grad():
        theirs = reference(**reference_inputs(aligner.processor, prompt)).logits[0]
    ours = aligner.logits(prompt)
    same = bool(torch.equal(ours.argmax(-1), theirs.argmax(-1)))
    diff = float((ours - theirs).abs().max()) if ours.shape == theirs.shape else float("inf")
    return CaseReport("aligner", prompt.num_tokens, same, diff)
