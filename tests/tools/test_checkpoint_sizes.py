"""make-tiny's sizes: every size wires the stages as the real checkpoint does; medium and slice have the real
codec layout, slice the real widths. Configs are checked through transformers' own config classes, parameter
counts on the meta device (no memory); the medium checkpoint is also made and loaded by transformers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from omnistage.families.qwen3_omni.checkpoint_config import checkpoint_config_dict
from omnistage.families.qwen3_omni.checkpoint_sizes import MEDIUM, SIZES, SLICE, CheckpointSize, DecoderWidths
from omnistage.tiny.chat_template import QWEN3_OMNI_CHAT_TEMPLATE
from omnistage.families.qwen3_omni.make_tiny import BPE_SIZE, _role_ids
from omnistage.families.registry import resolve_model
from omnistage.tiny.tokenizer import TokenizerLayout, save_tokenizer

REAL_CODEC_IDS = {"codec_pad_id": 2148, "codec_bos_id": 2149, "codec_eos_token_id": 2150, "codec_nothink_id": 2155,
                  "codec_think_bos_id": 2156, "codec_think_eos_id": 2157}
REAL_SPEAKERS = {"chelsie": 2301, "ethan": 2302, "aiden": 2303}
Layout = tuple[TokenizerLayout, dict[str, int]]  # the tokenizer's special ids and its role-word ids


@pytest.fixture(scope="module")
def layout(tmp_path_factory: pytest.TempPathFactory) -> Layout:
    """The offline tokenizer every size shares (no weights)."""
    out = tmp_path_factory.mktemp("tokenizer")
    return save_tokenizer(out, BPE_SIZE, QWEN3_OMNI_CHAT_TEMPLATE), _role_ids(out)


def _config(layout: Layout, size: CheckpointSize):  # noqa: ANN202
    from transformers import Qwen3OmniMoeConfig

    return Qwen3OmniMoeConfig(**checkpoint_config_dict(*layout, size))


def _param_count(config) -> int:  # noqa: ANN001
    from transformers import Qwen3OmniMoeForConditionalGeneration

    with torch.device("meta"):
        model = Qwen3OmniMoeForConditionalGeneration(config)
    return sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("name", sorted(SIZES))
def test_every_size_wires_the_stages_like_the_real_model(layout: Layout, name: str) -> None:
    cfg = _config(layout, SIZES[name])
    th, tk, cw = cfg.thinker_config, cfg.talker_config, cfg.code2wav_config
    text = th.text_config
    assert th.audio_config.output_dim == th.vision_config.out_hidden_size == tk.thinker_hidden_size == text.hidden_size
    assert tk.code_predictor_config.hidden_size == tk.text_config.hidden_size
    assert tk.num_code_groups == tk.code_predictor_config.num_code_groups == cw.num_quantizers
    assert tk.text_config.vocab_size == 1024 + cw.codebook_size
    top = range(tk.text_config.vocab_size - 1024, tk.text_config.vocab_size)
    assert all(cid in top for cid in (tk.codec_pad_id, tk.codec_eos_token_id, *tk.speaker_id.values()))
    assert sum(text.rope_parameters["mrope_section"]) == text.head_dim // 2
    assert 0 < tk.accept_hidden_layer <= text.num_hidden_layers
    rates = [*cw.upsample_rates, *cw.upsampling_ratios]
    assert torch.tensor(rates).prod().item() == 1920  # 24 kHz at 12.5 Hz


@pytest.mark.parametrize("size", [MEDIUM, SLICE], ids=["medium", "slice"])
def test_medium_and_slice_have_the_real_codec_layout(layout: Layout, size: CheckpointSize) -> None:
    cfg = _config(layout, size)
    tk, cw = cfg.talker_config, cfg.code2wav_config
    assert (tk.num_code_groups, cw.codebook_size, tk.text_config.vocab_size) == (16, 2048, 3072)
    assert tk.code_predictor_config.vocab_size == 2048
    assert {k: getattr(tk, k) for k in REAL_CODEC_IDS} == REAL_CODEC_IDS
    assert tk.speaker_id == REAL_SPEAKERS


def test_slice_has_the_real_widths(layout: Layout) -> None:
    cfg = _config(layout, SLICE)
    text, talker = cfg.thinker_config.text_config, cfg.talker_config.text_config
    predictor, cw = cfg.talker_config.code_predictor_config, cfg.code2wav_config
    assert (text.hidden_size, text.num_experts, text.num_experts_per_tok, text.moe_intermediate_size,
            text.num_attention_heads, text.num_key_value_heads, text.head_dim) == (2048, 128, 8, 768, 32, 4, 128)
    assert text.rope_parameters["mrope_section"] == [24, 20, 20]
    assert (talker.hidden_size, talker.num_experts, talker.num_experts_per_tok, talker.moe_intermediate_size,
            talker.shared_expert_intermediate_size, talker.num_attention_heads, talker.num_key_value_heads) == (
        1024, 128, 6, 384, 768, 16, 2)
    assert (predictor.hidden_size, predictor.num_hidden_layers, predictor.num_attention_heads,
            predictor.num_key_value_heads, predictor.intermediate_size) == (1024, 5, 16, 8, 3072)
    assert (cw.hidden_size, cw.num_hidden_layers, cw.decoder_dim, cw.intermediate_size) == (1024, 8, 1536, 3072)
    assert text.num_hidden_layers <= 4  # a slice: real widths, few layers
    params = _param_count(cfg)
    assert 1.5e9 < params < 2.5e9  # within a few GB in bf16


def test_medium_is_tens_of_millions_of_parameters_with_compute_heavy_stacks(layout: Layout) -> None:
    params = _param_count(_config(layout, MEDIUM))
    assert 5e7 < params < 2e8
    assert MEDIUM.thinker.hidden >= 512 and MEDIUM.thinker.experts >= 32 and MEDIUM.code_predictor.layers == 5


def test_medium_loads_in_transformers(medium_dir: Path) -> None:
    from transformers import Qwen3OmniMoeForConditionalGeneration

    model = Qwen3OmniMoeForConditionalGeneration.from_pretrained(medium_dir).eval()
    assert model.talker.config.num_code_groups == 16
    config = json.loads((medium_dir / "config.json").read_text())
    assert config["talker_config"]["codec_eos_token_id"] == 2150


def test_size_checks_reject_inconsistent_widths() -> None:
    with pytest.raises(ValueError, match="mrope_section"):
        CheckpointSize("bad", MEDIUM.thinker, MEDIUM.talker, MEDIUM.code_predictor, MEDIUM.audio, MEDIUM.vision,
                       MEDIUM.code2wav, 2048, 16, 3, mrope_section=(24, 20, 20))
    with pytest.raises(ValueError, match="code predictor"):
        CheckpointSize("bad", MEDIUM.thinker, MEDIUM.talker, DecoderWidths(MEDIUM.talker.hidden * 2, 5, 4, 2, 64, 512), MEDIUM.audio,
                       MEDIUM.vision, MEDIUM.code2wav, 2048, 16, 3, mrope_section=(16, 8, 8))


def test_size_names_resolve_to_cached_checkpoints(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OMNISTAGE_CACHE", str(tmp_path))
    path = resolve_model("tiny")
    assert path.parent == tmp_path and path.name.startswith("tiny-")
