"""Voices: cloning follows the reference recording; each model type takes only its own kind of voice."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from omnistage.families.qwen3_tts.offline import TTSSettings, generate_offline
from omnistage.models.qwen3_tts.prompt import PromptSpec, language_id
from omnistage.models.qwen3_tts.request import SpeechInput, make_voice_clone, prompt_spec
from omnistage.tools.verify.tts_compare import REF_TEXT, synthetic_voice

SETTINGS = TTSSettings(max_new_tokens=10)


@pytest.mark.parametrize("transcript", [REF_TEXT, None], ids=["in-context", "x-vector"])
def test_a_different_reference_recording_changes_the_voice(tts_models, tts_tokenizer, transcript):
    models = tts_models["base"]

    def speak(voice: np.ndarray):
        clone = make_voice_clone(models, tts_tokenizer, voice, 24000, transcript)
        return clone, generate_offline(models, tts_tokenizer, SpeechInput("Hello there.", voice_clone=clone), SETTINGS)

    clone_a, a = speak(synthetic_voice(pitch=140.0, seed=0))
    clone_b, b = speak(synthetic_voice(pitch=220.0, seed=1))
    _, again = speak(synthetic_voice(pitch=140.0, seed=0))
    assert not torch.allclose(clone_a.speaker_embedding, clone_b.speaker_embedding)
    assert not torch.equal(a.codes, b.codes)
    assert torch.equal(a.codes, again.codes)
    assert a.wav.shape == b.wav.shape == (9 * 1920,)
    assert (clone_a.ref_codes is None) == (transcript is None)


def test_voice_clone_resamples_other_rates(tts_models, tts_tokenizer):
    at_8k = synthetic_voice()[::3].copy()  # a 1.5 s recording at 8 kHz
    clone = make_voice_clone(tts_models["base"], tts_tokenizer, at_8k, 8000, REF_TEXT)
    assert clone.ref_codes.shape == (19, 4)


def test_each_model_type_takes_only_its_voices(tts_models, tts_tokenizer):
    cv, vd, base = (tts_models[k].config for k in ("custom_voice", "voice_design", "base"))
    clone = make_voice_clone(tts_models["base"], tts_tokenizer, synthetic_voice(), 24000)
    cases = [
        (cv, SpeechInput("Hi."), "needs a speaker"),
        (vd, SpeechInput("Hi.", speaker="ryan"), "no named speakers"),
        (base, SpeechInput("Hi."), "clones a voice"),
        (base, SpeechInput("Hi.", voice_clone=clone, instructions="loud"), "no instructions"),
        (cv, SpeechInput("Hi.", speaker="ryan", voice_clone=clone), "cannot clone"),
    ]
    for config, speech, message in cases:
        with pytest.raises(ValueError, match=message):
            prompt_spec(config, tts_tokenizer, speech)
    with pytest.raises(ValueError, match="empty"):
        SpeechInput("   ")
    with pytest.raises(ValueError, match="only Base models"):
        make_voice_clone(tts_models["custom_voice"], tts_tokenizer, synthetic_voice(), 24000)
    with pytest.raises(ValueError, match="unknown speaker"):
        generate_offline(tts_models["custom_voice"], tts_tokenizer, SpeechInput("Hi.", speaker="nobody"), SETTINGS)
    with pytest.raises(ValueError, match="unknown language"):
        generate_offline(tts_models["custom_voice"], tts_tokenizer,
                         SpeechInput("Hi.", speaker="ryan", language="klingon"), SETTINGS)


def test_languages_and_dialects_follow_the_reference(tts_models):
    config = tts_models["custom_voice"].config
    languages = config.talker.languages
    assert language_id(config, PromptSpec([0], speaker="ryan")) is None  # auto: no language row
    assert language_id(config, PromptSpec([0], speaker="ryan", language="English")) == languages["english"]
    # A dialect speaker speaking Chinese (or auto) speaks its dialect.
    assert language_id(config, PromptSpec([0], speaker="dylan")) == languages["beijing_dialect"]
    assert language_id(config, PromptSpec([0], speaker="dylan", language="chinese")) == languages["beijing_dialect"]
    assert language_id(config, PromptSpec([0], speaker="dylan", language="english")) == languages["english"]


def test_instructions_are_dropped_on_small_custom_voice_models(tts_models, tts_tokenizer):
    """As the reference wrapper does for 0.6B ('0b6') CustomVoice checkpoints."""
    from dataclasses import replace

    config = tts_models["custom_voice"].config
    speech = SpeechInput("Hi.", speaker="ryan", instructions="whisper")
    assert prompt_spec(config, tts_tokenizer, speech).instruct_ids is not None
    small = replace(config, tts_model_size="0b6")
    assert prompt_spec(small, tts_tokenizer, speech).instruct_ids is None
