"""``omnistage verify``: passes on the tiny checkpoint and on one shaped differently, fails on a real difference."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from omnistage.entrypoints.cli import main
from omnistage.tools.verify import run_verify

# Special ids of the variant: the top of a 320-token vocabulary, clear of the verify prompts' filler
# ids (100..128, newline 198); each start id is followed by its end id, as in the real vocabulary.
IDS = {"im_start": 300, "im_end": 301, "tts_pad": 302, "tts_bos": 303, "tts_eos": 304, "audio_start": 305,
       "audio": 307, "vision_start": 308, "image": 310, "video": 311, "system": 290, "user": 291, "assistant": 292}
CODEBOOK, GROUPS = 32, 3


def _rope(section: list[int]) -> dict[str, object]:
    return {"rope_type": "default", "rope_theta": 1e6, "mrope_section": section, "interleaved": True,
            "mrope_interleaved": True}


def _media_ids() -> dict[str, int]:
    """The multimodal ids both the thinker and the talker config must carry (transformers reads each its own)."""
    return {"audio_token_id": IDS["audio"], "image_token_id": IDS["image"], "video_token_id": IDS["video"],
            "audio_start_token_id": IDS["audio_start"], "vision_start_token_id": IDS["vision_start"],
            "position_id_per_seconds": 25}


def _thinker() -> dict[str, object]:
    text = {"vocab_size": 320, "hidden_size": 48, "intermediate_size": 64, "num_hidden_layers": 3,
            "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 12, "num_experts": 6,
            "num_experts_per_tok": 3, "moe_intermediate_size": 16, "rope_parameters": _rope([2, 2, 2])}
    audio = {"num_mel_bins": 128, "encoder_layers": 1, "encoder_attention_heads": 2, "encoder_ffn_dim": 32,
             "d_model": 16, "output_dim": 48, "downsample_hidden_size": 8, "n_window": 50}
    vision = {"depth": 2, "hidden_size": 16, "intermediate_size": 32, "num_heads": 2, "patch_size": 16,
              "spatial_merge_size": 2, "temporal_patch_size": 2, "out_hidden_size": 48,
              "deepstack_visual_indexes": [0]}
    return {"text_config": text, "audio_config": audio, "vision_config": vision, "user_token_id": IDS["user"],
            **_media_ids()}


def _talker() -> dict[str, object]:
    text = {"vocab_size": 1024 + CODEBOOK, "hidden_size": 24, "intermediate_size": 32, "num_hidden_layers": 2,
            "num_attention_heads": 3, "num_key_value_heads": 1, "head_dim": 8, "num_experts": 4,
            "num_experts_per_tok": 2, "moe_intermediate_size": 16, "shared_expert_intermediate_size": 24,
            "rope_parameters": _rope([2, 1, 1])}
    predictor = {"vocab_size": CODEBOOK, "hidden_size": 24, "intermediate_size": 32, "num_hidden_layers": 1,
                 "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 12, "num_code_groups": GROUPS,
                 "rope_parameters": {"rope_type": "default", "rope_theta": 1e4}}
    codec = {"codec_pad_id": 40, "codec_bos_id": 41, "codec_eos_token_id": 42, "codec_nothink_id": 43,
             "codec_think_bos_id": 44, "codec_think_eos_id": 45}  # inside the top 1024 ids
    return {"text_config": text, "code_predictor_config": predictor, "num_code_groups": GROUPS,
            "thinker_hidden_size": 48, "accept_hidden_layer": 2, "spatial_merge_size": 2,
            "speaker_id": {"ethan": 50, "chelsie": 51}, **codec, **_media_ids()}


def make_variant(out: Path) -> Path:
    """A checkpoint unlike make-tiny's, written by transformers' own ``save_pretrained`` (hub layout,
    one tensor per expert) and without tokenizer files."""
    from transformers import Qwen3OmniMoeConfig, Qwen3OmniMoeForConditionalGeneration

    code2wav = {"codebook_size": CODEBOOK, "num_quantizers": GROUPS, "hidden_size": 16, "num_hidden_layers": 1,
                "num_attention_heads": 2, "num_key_value_heads": 2, "intermediate_size": 32, "decoder_dim": 32,
                "upsample_rates": [8, 5, 4, 3], "upsampling_ratios": [2, 2]}
    top = {f"{name}_token_id": IDS[name] for name in ("im_start", "im_end", "tts_pad", "tts_bos", "tts_eos",
                                                      "system", "user", "assistant")}
    config = Qwen3OmniMoeConfig(thinker_config=_thinker(), talker_config=_talker(), code2wav_config=code2wav,
                                **top)
    torch.manual_seed(1)
    model = Qwen3OmniMoeForConditionalGeneration(config).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            # transformers leaves the talker's fused experts as uninitialised memory.
            if name.endswith(("experts.gate_up_proj", "experts.down_proj")):
                param.normal_(0.0, 0.02)
        for module in model.code2wav.modules():
            # Default init makes the vocoder output ~1e-8, which any waveform bound would pass.
            if isinstance(module, (torch.nn.Conv1d, torch.nn.ConvTranspose1d)):
                fan_in = module.weight.shape[1] * module.weight.shape[2]
                if isinstance(module, torch.nn.ConvTranspose1d):
                    fan_in = module.weight.shape[0] * module.weight.shape[2] // module.stride[0]
                module.weight.normal_(0.0, 0.6 * fan_in**-0.5)
    model.save_pretrained(out)
    return out


def _assert_passes(report) -> None:  # noqa: ANN001
    assert [c.name for c in report.cases] == ["text", "text+audio", "text+image", "text+video"]
    for case in report.cases:
        assert case.ok, case
        assert case.frames > 0 and case.samples > 0  # audio exists: the talker's min tokens held
    assert report.ok


def test_verify_passes_on_tiny_checkpoint(tiny_dir: Path) -> None:
    report = run_verify(tiny_dir)
    _assert_passes(report)
    assert all(c.logits_max_abs_diff <= 1e-4 and c.wav_max_abs_diff <= 1e-4 for c in report.cases)


def test_verify_passes_on_a_differently_shaped_checkpoint(tmp_path: Path) -> None:
    folder = make_variant(tmp_path / "variant")
    assert not (folder / "tokenizer_config.json").exists()
    with safe_open(str(folder / "model.safetensors"), "pt") as f:  # the hub layout: one tensor per expert
        assert "talker.model.layers.0.mlp.experts.0.gate_proj.weight" in f.keys()
    report = run_verify(folder)
    _assert_passes(report)
    assert all(c.codes_identical and len(c.tokens) >= 2 for c in report.cases)


def _perturbed_copy(src: Path, dst: Path, tensor: str) -> Path:
    from safetensors.torch import load_file, save_file

    shutil.copytree(src, dst)
    tensors = load_file(str(src / "model.safetensors"))
    tensors[tensor] = tensors[tensor] * 1.01
    save_file(tensors, str(dst / "model.safetensors"), metadata={"format": "pt"})
    return dst


def test_verify_fails_when_omnistage_weights_differ(tiny_dir: Path, tmp_path: Path) -> None:
    # The vocoder's output conv: everything upstream stays identical, only the waveform moves.
    ours = _perturbed_copy(tiny_dir, tmp_path / "ours", "code2wav.decoder.6.conv.weight")
    report = run_verify(tiny_dir, ours_folder=ours, cases=["text"])
    case = report.cases[0]
    assert case.tokens_identical and case.codes_identical and case.logits_max_abs_diff <= 1e-4
    assert case.wav_max_abs_diff > 1e-4
    assert not case.ok and not report.ok


def test_cli_writes_json_and_exit_code(tiny_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "report.json"
    assert main(["verify", "--model", str(tiny_dir), "--case", "text", "--json", str(out)]) == 0
    table = capsys.readouterr().out
    assert "text" in table and table.strip().endswith("PASS")
    report = json.loads(out.read_text())
    assert report["ok"] is True and [c["name"] for c in report["cases"]] == ["text"]
    keys = {"name", "tokens_identical", "logits_max_abs_diff", "codes_identical", "wav_max_abs_diff"}
    assert keys <= set(report["cases"][0])
    assert main(["verify", "--model", str(tmp_path / "missing")]) == 2


def test_verify_passes_with_a_tensor_parallel_thinker(tiny_dir: Path) -> None:
    # text+image: deepstack features cross to the other rank too.
    report = run_verify(tiny_dir, cases=["text", "text+image"], tensor_parallel_size=2)
    assert [c.name for c in report.cases] == ["text", "text+image"] and report.ok
    assert all(c.tokens_identical and c.codes_identical and c.frames > 0 for c in report.cases)
    assert report.tensor_parallel_size == 2 and report.to_json()["tensor_parallel_size"] == 2
    assert all(c.logits_max_abs_diff <= 1e-4 for c in report.cases)
