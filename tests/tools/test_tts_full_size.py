"""The full Qwen3-TTS sizes have the published shapes: parameter counts on the meta device (nothing is drawn or
written), against the published files' sizes (Qwen3-TTS-12Hz-0.6B-Base: model.safetensors 1.83 GB in bf16,
speech_tokenizer/model.safetensors 682 MB in fp32)."""

from __future__ import annotations

from pathlib import Path

import pytest

from omnistage.models.qwen3_tts.checkpoint import Qwen3TTSModels
from omnistage.models.qwen3_tts.config import Qwen3TTSConfig
from omnistage.tiny.chat_template import QWEN3_OMNI_CHAT_TEMPLATE
from omnistage.families.qwen3_tts.make_tiny import BPE_SIZE
from omnistage.tiny.tokenizer import TokenizerLayout, save_tokenizer
from omnistage.families.qwen3_tts.checkpoint_config import (FULL, FULL_1_7B, TTSSize, model_config,
                                                            speech_tokenizer_config)

REAL_MAIN_BYTES_BF16 = 1.83e9  # the 0.6B Base's model.safetensors (talker, code predictor, speaker encoder)
REAL_CODEC_BYTES_FP32 = 682e6  # its speech_tokenizer/model.safetensors (decoder and encoder)


@pytest.fixture(scope="module")
def layout(tmp_path_factory: pytest.TempPathFactory) -> TokenizerLayout:
    return save_tokenizer(tmp_path_factory.mktemp("tok"), BPE_SIZE, QWEN3_OMNI_CHAT_TEMPLATE)


def _counts(size: TTSSize, layout: TokenizerLayout, kind: str) -> tuple[int, int, dict[str, tuple[int, ...]]]:
    config = Qwen3TTSConfig.from_dicts(model_config(size, layout, kind), speech_tokenizer_config(size))
    main, codec = Qwen3TTSModels.build(config, Path("."), device="meta").state_dicts()
    return (sum(t.numel() for t in main.values()), sum(t.numel() for t in codec.values()),
            {name: tuple(t.shape) for name, t in main.items()})


def test_full_matches_the_published_0_6b(layout: TokenizerLayout) -> None:
    main, codec, shapes = _counts(FULL, layout, "base")
    assert main * 2 == pytest.approx(REAL_MAIN_BYTES_BF16, rel=0.01)
    assert codec * 4 == pytest.approx(REAL_CODEC_BYTES_FP32, rel=0.01)
    assert shapes["talker.model.text_embedding.weight"] == (151936, 2048)
    assert shapes["talker.model.layers.27.mlp.gate_proj.weight"] == (3072, 1024)
    assert shapes["talker.model.layers.0.self_attn.q_proj.weight"] == (16 * 128, 1024)
    assert shapes["talker.model.layers.0.self_attn.k_proj.weight"] == (8 * 128, 1024)
    assert shapes["talker.code_predictor.model.layers.4.mlp.up_proj.weight"] == (3072, 1024)
    assert "talker.model.layers.28.mlp.up_proj.weight" not in shapes
    assert not any(name.startswith("talker.code_predictor.small_to_mtp_projection") for name in shapes)


def test_full_custom_voice_has_no_speaker_encoder(layout: TokenizerLayout) -> None:
    base, _, _ = _counts(FULL, layout, "base")
    custom, _, shapes = _counts(FULL, layout, "custom_voice")
    assert not any(name.startswith("speaker_encoder.") for name in shapes)
    assert 5e6 < base - custom < 15e6  # the ECAPA encoder: ~9 M parameters


def test_full_1_7b_is_the_1_7b_class(layout: TokenizerLayout) -> None:
    main, codec, shapes = _counts(FULL_1_7B, layout, "custom_voice")
    assert 1.7e9 < main < 2.0e9
    assert codec == _counts(FULL, layout, "custom_voice")[1]  # the same speech tokenizer
    assert shapes["talker.model.layers.0.mlp.gate_proj.weight"] == (6144, 2048)
    assert shapes["talker.code_predictor.small_to_mtp_projection.weight"] == (1024, 2048)
