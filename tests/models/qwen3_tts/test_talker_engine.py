"""The Qwen3-TTS talker under omnistage's AR engine: batched equals alone, seeded runs repeat."""

from __future__ import annotations

import torch

from omnistage.families.qwen3_tts.offline import (TTSSettings, engine_config, generate_offline, request_frames,
                                                 talker_request, talker_step_hook)
from omnistage.models.qwen3_tts.prompt import build_talker_prompt
from omnistage.models.qwen3_tts.request import SpeechInput, prompt_spec
from omnistage.runner import build_ar_engine
from omnistage.runner.base import TalkerModel

INPUTS = [
    SpeechInput("Hello, how are you today?", speaker="ryan", language="english"),
    SpeechInput("Tell me a short story about a little robot.", speaker="vivian",
                instructions="Speak slowly and warmly."),
    SpeechInput("Numbers like 1, 2, 3 and 42.", speaker="dylan", non_streaming=False),  # trailing text per step
]


def _run(models, tokenizer, inputs, settings):
    prompts = [build_talker_prompt(models.talker, models.config, prompt_spec(models.config, tokenizer, i))
               for i in inputs]
    requests = [talker_request(models.config, f"r{k}", p, settings.talker_params()) for k, p in enumerate(prompts)]
    longest = max(r.num_prompt_tokens for r in requests) + settings.max_new_tokens
    engine = build_ar_engine(models.talker, engine_config(models, longest, max_num_seqs=len(requests)),
                             talker_step_hook(models.talker, models.config))
    for request in requests:
        engine.add_request(request)
    engine.run_until_done()
    return [request_frames(r) for r in requests]


def test_the_talker_meets_the_runner_contract(tts_models):
    talker = tts_models["custom_voice"].talker
    assert isinstance(talker, TalkerModel)
    assert (talker.num_code_groups, talker.residual_vocab_size) == (4, 64)
    assert tuple(talker.kv_cache_spec()) == (2, 2, 16)


def test_batched_talker_equals_each_request_alone(tts_models, tts_tokenizer):
    """Greedy codes are compared exactly: make-tiny's wide heads keep logit gaps far above float noise."""
    models, settings = tts_models["custom_voice"], TTSSettings(max_new_tokens=14)
    together = _run(models, tts_tokenizer, INPUTS, settings)
    for speech, frames in zip(INPUTS, together):
        alone = _run(models, tts_tokenizer, [speech], settings)[0]
        assert frames.shape == (13, 4)
        assert torch.equal(frames, alone)
    assert not torch.equal(together[0], together[1])  # different prompts speak differently


def test_seeded_sampling_repeats_and_differs_from_greedy(tts_models, tts_tokenizer):
    models = tts_models["custom_voice"]
    sampled = TTSSettings(max_new_tokens=12, temperature=0.9, seed=7)
    first = generate_offline(models, tts_tokenizer, INPUTS[0], sampled)
    again = generate_offline(models, tts_tokenizer, INPUTS[0], sampled)
    greedy = generate_offline(models, tts_tokenizer, INPUTS[0], TTSSettings(max_new_tokens=12))
    assert torch.equal(first.codes, again.codes)
    torch.testing.assert_close(first.wav, again.wav, atol=0, rtol=0)  # the same computation, run twice
    assert not torch.equal(first.codes, greedy.codes)
    assert first.wav.shape == (11 * 1920,)
