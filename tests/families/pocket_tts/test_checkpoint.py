"""Pocket TTS's configs, make-tiny sizes and the registry line."""

import json

import pytest

from omnistage.families.pocket_tts.config import CODEC_FOLDER, CodecConfig, PocketCheckpoint, PocketConfig
from omnistage.families.pocket_tts.family import audio_spec
from omnistage.families.pocket_tts.make_tiny import configs
from omnistage.families.pocket_tts.prompt import PocketTokenizer, prepare_text
from omnistage.families.registry import DEFAULT_REGISTRY


def test_full_size_has_the_published_shapes():
    model_raw, codec_raw = configs("full")
    model, codec = PocketConfig.from_dict(model_raw), CodecConfig.from_dict(codec_raw)
    assert (model.num_hidden_layers, model.hidden_size, model.num_attention_heads, model.latent_dim) == (6, 1024, 16, 32)
    assert (model.flow_head.hidden_size, model.flow_head.num_hidden_layers, model.vocab_size) == (512, 6, 4004)
    assert codec.frame_size == 1920 and codec.sampling_rate == 24000


def test_registry_recognises_the_folder(pocket_lsd):
    family = DEFAULT_REGISTRY.for_folder(pocket_lsd)
    assert family.name == "pocket_tts"
    spec = audio_spec(family.load_config(pocket_lsd))
    assert spec.frame_width == 32 and float(spec.frame_rate) == 12.5 and spec.sample_rate == 24000


def test_config_refuses_what_the_decoder_cannot_run(pocket_lsd):
    raw = json.loads((pocket_lsd / CODEC_FOLDER / "config.json").read_text())
    with pytest.raises(ValueError, match="use_causal_conv"):
        CodecConfig.from_dict({**raw, "use_causal_conv": False})
    with pytest.raises(ValueError, match="flow_type"):
        PocketConfig.from_dict({"flow_head_config": {"flow_type": "ddpm"}})


def test_prompt_layout(pocket_lsd):
    ckpt = PocketCheckpoint.from_folder(pocket_lsd)
    prompt = PocketTokenizer(pocket_lsd, ckpt.model).prompt("  hello   world ")
    ids = prompt.input_ids(ckpt.model).tolist()
    assert ids[0] == ckpt.model.audio_prompt_bos_token_id and ids[-1] == ckpt.model.audio_bos_token_id
    assert prompt.frames_after_eos == 4  # a short text: the longer tail
    assert prepare_text("hello world") == "Hello world."
    with pytest.raises(ValueError):
        prepare_text("   ")
