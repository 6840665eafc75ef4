"""Qwen3-TTS served as a two-stage pipeline (talker with its code predictor → codec decoder): recognised from
its config.json, streamed audio equals the whole answer and the offline generation on the same weights, and a
cloned voice's reference frames prime the codec stream."""

from __future__ import annotations

import queue
from pathlib import Path

import numpy as np
import pytest
import torch

from omnistage.config.pipeline import parse_pipeline
from omnistage.core import Modality, OmniRequest
from omnistage.families.speech import SpeechAsk
from omnistage.models.qwen3_tts.checkpoint import Qwen3TTSModels
from omnistage.families.qwen3_tts.offline import TTSSettings, generate_offline
from omnistage.models.qwen3_tts.request import SpeechInput, TextTokenizer, make_voice_clone, prompt_spec
from omnistage.pipeline.engine import OmniPipeline, preset_for
from omnistage.pipeline.runtime import PipelineOptions
from omnistage.sampling_params import SamplingParams
from omnistage.tools.verify.tts_compare import REF_TEXT, synthetic_voice
from tests.pipeline.specs import tts_small_dict

FRAMES = 12  # talker steps: 11 frames (a random talker never says codec EOS)
# Greedy with the reference's repetition penalty: the offline generation's settings.
GREEDY = SamplingParams(temperature=0.0, top_k=50, repetition_penalty=1.05, max_tokens=FRAMES)
TEXT = "Hello there, how are you today?"


def _folder(tmp_path_factory: pytest.TempPathFactory, kind: str) -> Path:
    from omnistage.families.qwen3_tts.make_tiny import make_tiny_tts

    return make_tiny_tts(tmp_path_factory.mktemp(f"tts-{kind}"), seed=0, tts_model_type=kind)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory):
    """A CustomVoice and a Base checkpoint, each served by its own pipeline (replicas as threads)."""
    pipelines = {}
    try:
        for kind in ("custom_voice", "base"):
            folder = _folder(tmp_path_factory, kind)
            pipelines[kind] = OmniPipeline(folder, parse_pipeline(tts_small_dict()), PipelineOptions(in_process=True))
        yield pipelines
    finally:
        for pipeline in pipelines.values():
            pipeline.close()


def _speak(pipeline: OmniPipeline, rid: str, prompt, stream: bool) -> tuple[np.ndarray, list[int]]:  # noqa: ANN001
    outputs: queue.Queue = queue.Queue()
    request = OmniRequest(rid, prompt, frozenset({Modality.AUDIO}), GREEDY, stream=stream,
                          initial_codec_chunk_frames=2)
    pipeline.submit(request, outputs.put)
    chunks: list[np.ndarray] = []
    while True:
        out = outputs.get(timeout=120)
        if out.audio is not None:
            chunks.append(out.audio)
        if out.finished:
            assert out.error is None, out.error
            assert out.usage.completion_tokens == FRAMES - 1 and out.usage.prompt_tokens == prompt.num_tokens
            return np.concatenate(chunks), [c.size for c in chunks]


def test_the_checkpoint_is_served_by_the_tts_preset(served) -> None:
    pipeline = served["custom_voice"]
    assert preset_for(_folder_of(pipeline)).name == "qwen3_tts.yaml" and pipeline.family.name == "qwen3_tts"
    assert pipeline.graph.entry == "talker" and pipeline.supports_audio and not pipeline.supports_text
    assert pipeline.front_end.processor is None and pipeline.front_end.voices == ("aiden", "dylan", "ryan", "vivian")


def _folder_of(pipeline: OmniPipeline) -> Path:
    return Path(pipeline.model_name)  # served under its folder's name


def test_streamed_audio_equals_the_whole_answer_and_the_offline_generation(served) -> None:
    pipeline = served["custom_voice"]
    prompt = pipeline.front_end.speech.prompt(SpeechAsk(TEXT, voice="ryan"))
    streamed, sizes = _speak(pipeline, "streamed", prompt, stream=True)
    whole, whole_sizes = _speak(pipeline, "whole", prompt, stream=False)
    assert len(sizes) >= 4 and sizes[0] == 2 * 1920  # a small first chunk, then chunks as the player needs
    assert streamed.shape == whole.shape == ((FRAMES - 1) * 1920,)
    torch.testing.assert_close(torch.from_numpy(streamed), torch.from_numpy(whole), atol=1e-5, rtol=0)
    models = Qwen3TTSModels.load(_folder_of(pipeline))
    offline = generate_offline(models, TextTokenizer(_folder_of(pipeline)), SpeechInput(TEXT, speaker="ryan"),
                               TTSSettings(max_new_tokens=FRAMES))
    torch.testing.assert_close(torch.from_numpy(streamed), offline.wav, atol=1e-5, rtol=0)


def test_a_cloned_voice_primes_the_codec_stream_as_the_reference_decodes(served) -> None:
    pipeline = served["base"]
    folder = _folder_of(pipeline)
    models, tokenizer = Qwen3TTSModels.load(folder), TextTokenizer(folder)
    clone = make_voice_clone(models, tokenizer, synthetic_voice(), 24000, REF_TEXT)  # in context: codes + text
    speech = SpeechInput("Hello there.", voice_clone=clone)
    streamed, _ = _speak(pipeline, "clone", prompt_spec(models.config, tokenizer, speech), stream=True)
    offline = generate_offline(models, tokenizer, speech, TTSSettings(max_new_tokens=FRAMES))
    torch.testing.assert_close(torch.from_numpy(streamed), offline.wav, atol=1e-5, rtol=0)
    other = make_voice_clone(models, tokenizer, synthetic_voice(pitch=220.0, seed=1), 24000, REF_TEXT)
    changed, _ = _speak(pipeline, "other", prompt_spec(models.config, tokenizer,
                                                       SpeechInput("Hello there.", voice_clone=other)), stream=True)
    assert not np.allclose(changed, streamed)


def test_the_speech_front_end_takes_what_each_checkpoint_type_takes(served, tmp_path_factory) -> None:
    from omnistage.families.qwen3_tts.speech import Qwen3TTSSpeech
    from omnistage.models.qwen3_tts.config import Qwen3TTSConfig

    folder = _folder(tmp_path_factory, "voice_design")
    design = Qwen3TTSSpeech(folder, Qwen3TTSConfig.from_folder(folder))
    assert design.speakers == () and design.needs_instructions
    with pytest.raises(ValueError, match="needs the voice described in instructions"):
        design.prompt(SpeechAsk("Hello there."))
    described = design.prompt(SpeechAsk("Hello there.", voice="alloy", instructions="A calm low voice."))
    assert described.speaker is None and described.instruct_ids  # the voice is the description
    with pytest.raises(ValueError, match="speaks in a cloned voice"):
        served["base"].front_end.speech.prompt(SpeechAsk("Hello there."))
    custom = served["custom_voice"].front_end.speech
    prompt = custom.prompt(SpeechAsk("Hello there.", voice="ryan"))
    assert custom.max_frames(prompt, 10_000) == 8 * prompt.num_tokens + 40  # bounded by the text, not the context
    assert custom.max_frames(prompt, prompt.num_tokens + 20) == 4
    with pytest.raises(ValueError, match="context"):
        custom.max_frames(prompt, prompt.num_tokens)
