"""``make-tiny --model-type qwen2_5_omni``: a checkpoint transformers loads and speaks from, made offline, whose
random weights keep greedy choices stable; ``omnistage verify``'s thinker check passes on it."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from omnistage.families.qwen2_5_omni.tiny_config import CODEC
from omnistage.families.qwen2_5_omni.verify import verify_folder
from omnistage.families.qwen2_5_omni.verify_cases import CASE_NAMES
from omnistage.families.registry import DEFAULT_REGISTRY

MEL_SAMPLES_PER_CODE = 2 * 240  # two mel frames per code, BigVGAN's 5·3·2·2·2·2 samples per frame


def test_the_registry_resolves_the_checkpoint(omni25_dir: Path) -> None:
    family = DEFAULT_REGISTRY.for_folder(omni25_dir)
    assert family.name == "qwen2_5_omni"
    config = family.load_config(omni25_dir)
    assert config.has_talker and config.eos_token_id is not None


def test_transformers_generates_text_and_audio(omni25_dir: Path, reference: torch.nn.Module) -> None:
    assert set(reference.speaker_map) == {"Chelsie", "Ethan"}
    ids = torch.tensor([[563, 273, 198, 505, 11, 564, 198, 563, 275, 198]])
    torch.manual_seed(0)
    with torch.no_grad():
        sequences, wav = reference.generate(ids, speaker="Ethan", thinker_max_new_tokens=4,
                                            talker_max_new_tokens=6, talker_do_sample=False,
                                            token2wav_num_steps=2)
    assert sequences.shape[1] == ids.shape[1] + 4
    # EOS rows of the codec head are zero: the random talker speaks all its codes (6, less the first step's).
    assert wav.ndim == 1 and wav.numel() % MEL_SAMPLES_PER_CODE == 0 and wav.numel() >= 4 * MEL_SAMPLES_PER_CODE
    assert 1e-3 < wav.abs().max() <= 1.0  # audible, not ~1e-8


def test_greedy_margins_are_wide(omni25_dir: Path, reference: torch.nn.Module) -> None:
    """Top-1 minus top-2 logit of the thinker's and the talker's greedy steps: far above float noise."""
    ids = torch.tensor([[563, 273, 198, 505, 11, 517, 332, 331, 30, 564, 198, 563, 275, 198]])
    with torch.no_grad():
        logits = reference.thinker(input_ids=ids, attention_mask=torch.ones_like(ids)).logits[0]
    top = logits.topk(2).values
    assert (top[:, 0] - top[:, 1]).median() > 1.0
    head = reference.talker.codec_head.weight
    assert head[CODEC["eos"]].abs().sum() == 0 and head[CODEC["pad"]].abs().sum() == 0


@pytest.mark.parametrize("case", CASE_NAMES)
def test_verify_hook_thinker_tokens_identical(case: str, omni25_dir: Path) -> None:
    check = verify_folder(omni25_dir, new_tokens=6, case=case)
    assert check.ok and len(check.ours) == 6 and check.divergence() is None


@pytest.mark.parametrize("case", ("text", "audio_in_video"))  # the video with its sound track: every encoder
def test_verify_hook_talker_codes_and_waveform(case: str, omni25_dir: Path) -> None:
    from omnistage.families.qwen2_5_omni.verify import verify_spoken

    check = verify_spoken(omni25_dir, new_tokens=6, talker_tokens=12, case=case)
    assert check.ok and len(check.codes[0]) == 12, check
