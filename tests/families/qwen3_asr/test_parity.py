"""Qwen3-ASR against transformers' ``qwen3_asr``: greedy tokens identical and prompt logits within
``verify.TOLERANCE`` (1e-4, fp32 on a CPU) on the confident tiny, over a clip longer than the encoder's attention
window; logits alone on a plain transformers-initialised one (no confident head: its greedy steps are near-ties);
the published layout read to the same tensors as the ``-hf`` one."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

import torch

from omnistage.families.qwen3_asr.make_tiny import make_tiny
from omnistage.families.qwen3_asr.model import Qwen3ASR
from omnistage.families.qwen3_asr.prompt import Qwen3ASRPromptProcessor
from omnistage.families.qwen3_asr.sizes import TINY
from omnistage.families.qwen3_asr.stage import whole_prompt_hidden
from omnistage.families.qwen3_asr.verify import TOLERANCE, run_verify, synthetic_clip, verify_recogniser


def test_verify_on_the_tiny_recogniser(asr_dir: Path, capsys) -> None:
    assert run_verify(argparse.Namespace(tolerance=TOLERANCE), asr_dir) == 0
    out = capsys.readouterr().out
    assert out.count("greedy tokens identical") == 3, out


def test_the_tiny_writes_text_not_an_immediate_stop(asr_dir: Path) -> None:
    """Parity over zero tokens would prove nothing: the confident tiny writes every asked token."""
    from omnistage.families.qwen3_asr.verify import greedy_tokens

    model = Qwen3ASR.from_checkpoint(asr_dir)
    prompt = Qwen3ASRPromptProcessor(asr_dir, 50).prompt(synthetic_clip(1.2))
    tokens = greedy_tokens(model, prompt, 8)
    assert len(tokens) == 8 and len(set(tokens)) > 1


def test_plain_random_logits_match(tmp_path: Path) -> None:
    folder = make_tiny(tmp_path / "plain", seed=3, size=dataclasses.replace(TINY, tied=True))
    report = verify_recogniser(folder, "long", new_tokens=2)
    assert report.logits_max_abs_diff <= TOLERANCE


def test_published_layout_reads_the_same_tensors(asr_dir: Path, tmp_path: Path) -> None:
    published = make_tiny(tmp_path / "published", seed=0, layout="published")
    processor = Qwen3ASRPromptProcessor(asr_dir, 50)
    prompt = processor.prompt(synthetic_clip(2.0), "en", "earlier words")
    hidden = [whole_prompt_hidden(Qwen3ASR.from_checkpoint(f), prompt.token_ids, prompt.mels)
              for f in (asr_dir, published)]
    torch.testing.assert_close(hidden[0], hidden[1], rtol=0, atol=0)  # the same tensors, the same computation


def test_verify_on_the_tiny_aligner(aligner_dir: Path, capsys) -> None:
    """The aligner's class logits over every row of an audio + words + markers prompt, against transformers'
    token classification, and its argmax classes identical."""
    assert run_verify(argparse.Namespace(tolerance=TOLERANCE), aligner_dir) == 0
    assert "argmax classes identical" in capsys.readouterr().out


def test_aligner_times_each_word_within_the_audio(aligner_dir: Path) -> None:
    from omnistage.families.qwen3_asr.aligner import ForcedAligner

    times = ForcedAligner(aligner_dir).align(synthetic_clip(2.0), "Hello, big world! 你好")
    assert [t.word for t in times] == ["Hello", "big", "world", "你", "好"]
    assert all(0.0 <= t.start <= t.end <= 2.0 for t in times)
    assert [t.start for t in times] == sorted(t.start for t in times)


def test_published_aligner_layout_reads_the_same_tensors(aligner_dir: Path, tmp_path: Path) -> None:
    """Qwen's release of the aligner (``qwen3_forced_aligner``, ``thinker.lm_head`` of ``classify_num`` classes)."""
    from omnistage.families.qwen3_asr.aligner import ForcedAligner, split_words
    from omnistage.families.registry import DEFAULT_REGISTRY

    published = make_tiny(tmp_path / "published", seed=0, aligner=True, layout="published")
    assert DEFAULT_REGISTRY.for_folder(published).name == "qwen3_forced_aligner"
    ours, theirs = ForcedAligner(aligner_dir), ForcedAligner(published)
    prompt = ours.prompt(synthetic_clip(2.0), split_words("hello big world"))
    torch.testing.assert_close(ours.logits(prompt), theirs.logits(prompt), rtol=0, atol=0)
