"""make-tiny for Qwen3-TTS: deterministic files in the Hugging Face layout, parsed once into the typed config."""

from __future__ import annotations

import hashlib
import json
import pickle
from pathlib import Path

import pytest

from omnistage.entrypoints.cli import main
from omnistage.models.qwen3_tts.config import Qwen3TTSConfig, is_qwen3_tts
from omnistage.families.qwen3_tts.make_tiny import make_tiny_tts

FILES = ("config.json", "generation_config.json", "model.safetensors", "tokenizer.json", "vocab.json", "merges.txt",
         "tokenizer_config.json", "speech_tokenizer/config.json", "speech_tokenizer/model.safetensors",
         "speech_tokenizer/preprocessor_config.json")


def _digests(folder: Path) -> dict[str, str]:
    return {name: hashlib.sha256((folder / name).read_bytes()).hexdigest() for name in FILES}


def test_one_seed_gives_byte_identical_checkpoints(tmp_path, tts_dirs):
    again = make_tiny_tts(tmp_path / "again", seed=0, tts_model_type="custom_voice")
    assert _digests(again) == _digests(tts_dirs["custom_voice"])
    other = _digests(make_tiny_tts(tmp_path / "other", seed=1, tts_model_type="custom_voice"))
    assert other["model.safetensors"] != _digests(again)["model.safetensors"]
    assert other["config.json"] == _digests(again)["config.json"]


def test_cli_writes_each_type(tmp_path):
    assert main(["make-tiny", "--model-type", "qwen3_tts", "--tts-model-type", "base", str(tmp_path / "b")]) == 0
    config = Qwen3TTSConfig.from_folder(tmp_path / "b")
    assert config.is_base and config.speaker_encoder is not None
    assert main(["make-tiny", "--model-type", "qwen3_tts", "--size", "slice", str(tmp_path / "c")]) == 2


def test_the_config_is_parsed_once_into_frozen_types(tts_dirs):
    config = Qwen3TTSConfig.from_folder(tts_dirs["custom_voice"])
    talker = config.talker
    assert (talker.vocab_size, talker.num_code_groups, talker.codec.eos) == (1088, 4, 64 + 102)
    assert talker.speakers["ryan"] == 64 + 1013 and talker.speaker_dialects["dylan"] == "beijing_dialect"
    assert config.speech_tokenizer.decoder.samples_per_frame == 1920
    assert config.speaker_encoder is None and not config.is_base
    assert pickle.loads(pickle.dumps(config)) == config  # crosses process boundaries
    assert is_qwen3_tts(tts_dirs["custom_voice"])
    with pytest.raises(AttributeError):
        config.tts_model_type = "base"  # type: ignore[misc]


def test_inconsistent_configs_are_refused(tts_dirs):
    folder = tts_dirs["custom_voice"]
    raw = json.loads((folder / "config.json").read_text())
    tokenizer = json.loads((folder / "speech_tokenizer/config.json").read_text())
    bad_groups = {**raw, "talker_config": {**raw["talker_config"], "num_code_groups": 8}}
    with pytest.raises(ValueError, match="codebooks"):
        Qwen3TTSConfig.from_dicts(bad_groups, tokenizer)
    with pytest.raises(ValueError, match="tts_model_type"):
        Qwen3TTSConfig.from_dicts({**raw, "tts_model_type": "dialogue"}, tokenizer)
    with pytest.raises(ValueError, match="model_type"):
        Qwen3TTSConfig.from_dicts({**raw, "model_type": "qwen3_omni_moe"}, tokenizer)
    with pytest.raises(ValueError, match="12 Hz"):
        Qwen3TTSConfig.from_dicts(raw, {**tokenizer, "model_type": "qwen3_tts_tokenizer_25hz"})
