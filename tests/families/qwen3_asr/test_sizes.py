"""``make-tiny --model-type qwen3_asr --size full|full-1.7b`` are the published shapes: transformers builds each
config (on the meta device, no memory) to the published parameter counts; the CLI writes a loadable tiny of
either model type."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from omnistage.families.qwen3_asr.make_tiny import _save_tokenizer
from omnistage.families.qwen3_asr.sizes import SIZES, config_dict

REPO = Path(__file__).resolve().parents[3]


@pytest.mark.parametrize(("size", "billions"), [("full", (0.75, 0.95)), ("full-1.7b", (1.9, 2.45))])
def test_full_sizes_have_the_published_parameter_counts(size: str, billions: tuple[float, float],
                                                        tmp_path: Path) -> None:
    """Qwen3-ASR-0.6B holds 0.9B parameters with its encoder and tied head (the name counts the LM), 1.7B 2.3B."""
    from transformers import Qwen3ASRConfig, Qwen3ASRForConditionalGeneration

    ids = _save_tokenizer(tmp_path)
    config = Qwen3ASRConfig(**{k: v for k, v in config_dict(SIZES[size], 0, ids).items() if k != "model_type"})
    with torch.device("meta"):
        model = Qwen3ASRForConditionalGeneration(config)
    count = sum(p.numel() for p in model.parameters()) / 1e9
    assert billions[0] < count < billions[1], count


@pytest.mark.parametrize("model_type", ["qwen3_asr", "qwen3_forced_aligner"])
def test_make_tiny_command_writes_the_family_checkpoint(model_type: str, tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, "-m", "omnistage.entrypoints.cli", "make-tiny", "--model-type", model_type,
                          str(tmp_path / "ckpt")], capture_output=True, text=True, cwd=REPO, timeout=300)
    assert out.returncode == 0, out.stderr
    from omnistage.families.registry import DEFAULT_REGISTRY

    assert DEFAULT_REGISTRY.for_folder(tmp_path / "ckpt").name == model_type


@pytest.mark.parametrize(("layout", "published"), [("published", True), ("transformers", False)])
def test_make_tiny_layout_flag_picks_the_checkpoint_layout(layout: str, published: bool, tmp_path: Path) -> None:
    """``--layout`` is shared with Moshi's make-tiny: Qwen3-ASR takes transformers' (-hf) layout or Qwen's
    published one (config under ``thinker_config``), and refuses Moshi's."""
    import json

    run = [sys.executable, "-m", "omnistage.entrypoints.cli", "make-tiny", "--model-type", "qwen3_asr"]
    out = subprocess.run([*run, "--layout", layout, str(tmp_path / "ckpt")], capture_output=True, text=True, cwd=REPO,
                         timeout=300)
    assert out.returncode == 0, out.stderr
    assert ("thinker_config" in json.loads((tmp_path / "ckpt" / "config.json").read_text())) == published
    refused = subprocess.run([*run, "--layout", "personaplex", str(tmp_path / "other")], capture_output=True, text=True,
                             cwd=REPO, timeout=300)
    assert refused.returncode == 2 and "--layout personaplex" in refused.stderr
