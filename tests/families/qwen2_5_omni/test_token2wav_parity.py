"""Qwen2.5-Omni's token2wav (transformers' DiT + BigVGAN, noise from a per-utterance seeded generator) equals
transformers' whole-utterance decode of the talker's codes under ``torch.manual_seed(seed)``, within WAV_ATOL."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from omnistage.families.qwen2_5_omni.reference import reference_reply
from omnistage.models.qwen2_5_omni.token2wav import SAMPLES_PER_CODE, Token2Wav
from tests.families.qwen2_5_omni.conftest import prompt_cases

WAV_ATOL = 1e-5  # fp32, same operations in the same order; the tiny waveform's amplitude is ~0.05


@pytest.fixture(scope="module")
def ours(omni25_dir: Path) -> Token2Wav:
    return Token2Wav.from_checkpoint(omni25_dir)


@pytest.mark.parametrize("speaker", ("Chelsie", "Ethan"))
def test_whole_utterance_equals_transformers(speaker: str, ours: Token2Wav, reference: torch.nn.Module) -> None:
    case = prompt_cases(reference.config)["text"]
    theirs = reference_reply(reference, case.ids, case.hf_kwargs(), speaker, 8, 24, seed=3)
    voice = reference.speaker_map[speaker]
    wav = ours(torch.tensor(theirs.wav_codes), voice["cond"], voice["ref_mel"], seed=3)
    assert wav.shape == (len(theirs.wav_codes) * SAMPLES_PER_CODE,) == theirs.wav.shape
    assert (wav - theirs.wav).abs().max().item() < WAV_ATOL
    other = ours(torch.tensor(theirs.wav_codes), voice["cond"], voice["ref_mel"], seed=4)
    assert (other - theirs.wav).abs().max().item() > 100 * WAV_ATOL  # the seed picks the noise
