"""make-tiny writes a checkpoint that transformers itself loads and runs."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_files_and_size(tiny_dir: Path) -> None:
    for name in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "vocab.json",
                 "merges.txt", "chat_template.jinja", "preprocessor_config.json", "video_preprocessor_config.json"):
        assert (tiny_dir / name).is_file(), name
    total = sum(p.stat().st_size for p in tiny_dir.iterdir())
    assert total < 8 * 1024 * 1024
    config = json.loads((tiny_dir / "config.json").read_text())
    assert config["model_type"] == "qwen3_omni_moe"


def test_tokenizer_and_chat_template(tiny_dir: Path) -> None:
    from transformers import AutoConfig, AutoTokenizer

    cfg = AutoConfig.from_pretrained(tiny_dir)
    tok = AutoTokenizer.from_pretrained(tiny_dir)
    assert len(tok) <= cfg.thinker_config.text_config.vocab_size
    messages = [{"role": "user", "content": [{"type": "audio", "audio": "clip.wav"},
                                             {"type": "text", "text": "What is said?"}]}]
    text = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert text == ("<|im_start|>user\n<|audio_start|><|audio_pad|><|audio_end|>What is said?<|im_end|>\n"
                    "<|im_start|>assistant\n")
    ids = tok(text).input_ids
    assert ids[:2] == [cfg.im_start_token_id, cfg.user_token_id]
    assert cfg.thinker_config.audio_start_token_id in ids and cfg.thinker_config.audio_token_id in ids
    assert ids[-3:-1] == [cfg.im_start_token_id, cfg.assistant_token_id]
    assert tok.decode(tok("Hello, world!").input_ids) == "Hello, world!"
    for name, tid in (("<tts_pad>", cfg.tts_pad_token_id), ("<tts_text_bos>", cfg.tts_bos_token_id),
                      ("<tts_text_eod>", cfg.tts_eos_token_id), ("<|image_pad|>", cfg.thinker_config.image_token_id)):
        assert tok.convert_tokens_to_ids(name) == tid


def test_processor_parts_load(tiny_dir: Path) -> None:
    from transformers import AutoFeatureExtractor, AutoImageProcessor

    features = AutoFeatureExtractor.from_pretrained(tiny_dir)
    out = features([np.zeros(16000, dtype=np.float32)], sampling_rate=16000, return_tensors="pt")
    assert out["input_features"].shape[1] == 128
    images = AutoImageProcessor.from_pretrained(tiny_dir)
    assert images.merge_size == 2 and images.patch_size == 16


@pytest.mark.skipif(importlib.util.find_spec("torchvision") is None,
                    reason="transformers' Qwen3-Omni video processor needs torchvision (not installable beside the CPU torch wheel)")
def test_auto_processor_loads(tiny_dir: Path) -> None:
    from transformers import AutoProcessor

    processor = AutoProcessor.from_pretrained(tiny_dir)
    assert processor.audio_token == "<|audio_pad|>"


def test_model_generates_text_and_audio(tiny_dir: Path) -> None:
    from transformers import AutoFeatureExtractor, AutoTokenizer, Qwen3OmniMoeForConditionalGeneration
    from transformers.models.qwen3_omni_moe.processing_qwen3_omni_moe import _get_feat_extract_output_lengths

    model = Qwen3OmniMoeForConditionalGeneration.from_pretrained(tiny_dir).eval()
    tok = AutoTokenizer.from_pretrained(tiny_dir)
    features = AutoFeatureExtractor.from_pretrained(tiny_dir)
    audio = np.random.RandomState(0).randn(16000).astype(np.float32) * 0.1
    feats = features([audio], sampling_rate=16000, return_attention_mask=True, return_tensors="pt")
    n_audio = int(_get_feat_extract_output_lengths(feats["attention_mask"].sum(-1), 50)[0])
    messages = [{"role": "user", "content": [{"type": "audio"}, {"type": "text", "text": "Say hi."}]}]
    text = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    enc = tok([text.replace("<|audio_pad|>", "<|audio_pad|>" * n_audio)], return_tensors="pt")
    with torch.no_grad():
        ids, wav = model.generate(
            input_ids=enc.input_ids, attention_mask=enc.attention_mask, input_features=feats["input_features"],
            feature_attention_mask=feats["attention_mask"], thinker_max_new_tokens=6, thinker_do_sample=False,
            talker_max_new_tokens=12, talker_min_new_tokens=8, talker_do_sample=False, speaker="Ethan",
        )
    assert ids.shape[1] > enc.input_ids.shape[1]
    assert wav is not None and wav.numel() >= 8 * 1920
    assert 1e-3 < float(wav.abs().max()) <= 1.0


def test_same_seed_is_byte_identical(tmp_path: Path, tiny_dir: Path) -> None:
    from omnistage.families.qwen3_omni.make_tiny import make_tiny

    again = make_tiny(tmp_path / "again", seed=0)
    for name in ("model.safetensors", "config.json", "tokenizer.json", "vocab.json", "merges.txt"):
        assert _sha(again / name) == _sha(tiny_dir / name), name
    other = make_tiny(tmp_path / "other", seed=1)
    assert _sha(other / "model.safetensors") != _sha(tiny_dir / "model.safetensors")


def test_cli_and_cache(tmp_path: Path) -> None:
    env_cache = tmp_path / "cache"
    cmd = [sys.executable, "-m", "omnistage.entrypoints.cli", "make-tiny", "--cached"]
    import os

    env = {**os.environ, "OMNISTAGE_CACHE": str(env_cache)}
    first = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120, check=True)
    path = Path(first.stdout.strip().splitlines()[-1])
    assert path.parent == env_cache and (path / "model.safetensors").is_file()
    stamp = (path / "model.safetensors").stat().st_mtime_ns
    second = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120, check=True)
    assert Path(second.stdout.strip().splitlines()[-1]) == path
    assert (path / "model.safetensors").stat().st_mtime_ns == stamp  # reused, not rebuilt


def test_resolve_model_errors(tmp_path: Path) -> None:
    from omnistage.families.registry import resolve_model

    with pytest.raises(FileNotFoundError, match="config.json"):
        resolve_model(str(tmp_path))
