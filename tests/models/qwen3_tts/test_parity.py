"""Each Qwen3-TTS module against the qwen-tts reference (0.1.1, its own environment) on tiny checkpoints."""

from __future__ import annotations

import copy

import pytest
import torch

from omnistage.families.qwen3_tts.offline import TTSSettings, generate_offline
from omnistage.tools.verify.tts_compare import TOLERANCE, cases_for, compare_case, speech_input, synthetic_voice
from omnistage.families.qwen3_tts.checkpoint_config import TTS_MODEL_TYPES
from tests.models.qwen3_tts.conftest import MAX_NEW_TOKENS


def test_codec_decoder_matches_reference(tts_models, reference, probe_codes):
    theirs = reference["custom_voice"]["probe.decoder_wav"]
    ours = tts_models["custom_voice"].codec_decoder(probe_codes[None])[0, 0]
    assert ours.shape == theirs.shape == (90 * 1920,)
    assert theirs.abs().max() > 1e-2  # an audible random vocoder: the bound below tests something
    torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=0)


def test_codec_encoder_matches_reference(tts_models, reference):
    ours = tts_models["base"].codec_encoder.encode(torch.from_numpy(synthetic_voice()))
    theirs = reference["base"]["probe.encoder_codes"]
    assert ours.shape == theirs.shape == (19, 4)  # ceil(1.5 s * 12.5 Hz) frames, the valid quantizers
    assert torch.equal(ours, theirs)


def test_speaker_encoder_matches_reference(tts_models, reference):
    ours = tts_models["base"].speaker_encoder.embed(torch.from_numpy(synthetic_voice()))
    theirs = reference["base"]["probe.speaker_embedding"]
    assert ours.shape == theirs.shape == (32,)
    torch.testing.assert_close(ours, theirs, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("kind", TTS_MODEL_TYPES)
def test_generation_matches_reference(kind, tts_models, tts_tokenizer, reference):
    """Prompt, talker, code predictor and decoder together, on every case of each checkpoint type: greedy codes
    identical, waveform within the verify tolerance."""
    models = tts_models[kind]
    for case in cases_for(models.config):
        ours = generate_offline(models, tts_tokenizer, speech_input(models, tts_tokenizer, case, synthetic_voice()),
                                TTSSettings(max_new_tokens=MAX_NEW_TOKENS))
        report = compare_case(case.name, ours, reference[kind][f"{case.name}.codes"],
                              reference[kind][f"{case.name}.wav"], TOLERANCE)
        assert report.frames == MAX_NEW_TOKENS - 1
        assert report.ok, report


def test_a_perturbed_talker_is_caught(tts_models, tts_tokenizer, reference):
    """The same comparison fails once one talker weight moves: the parity above can fail."""
    models = copy.deepcopy(tts_models["custom_voice"])
    with torch.no_grad():
        models.talker.model.layers[0].mlp.down_proj.weight.mul_(1.5)
    case = cases_for(models.config)[0]
    ours = generate_offline(models, tts_tokenizer, speech_input(models, tts_tokenizer, case, synthetic_voice()),
                            TTSSettings(max_new_tokens=MAX_NEW_TOKENS))
    report = compare_case(case.name, ours, reference["custom_voice"][f"{case.name}.codes"],
                          reference["custom_voice"][f"{case.name}.wav"], TOLERANCE)
    assert not report.ok
