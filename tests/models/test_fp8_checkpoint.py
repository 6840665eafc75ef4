"""FP8 checkpoints in the ModelOpt layout (``make-tiny --fp8``): recognised from ``quantization_config``, loaded
dequantised on a CPU, their logits equal to the unquantized model's with the same FP8 round trip applied to the
same weights; norms, routers, embeddings, the talker and the vocoder left untouched."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from omnistage.layers.attention.base import AttentionMetadata
from omnistage.layers.attention.context import ForwardContext, forward_context
from omnistage.layers.attention.torch_sdpa import TorchSDPABackend
from omnistage.layers.quant.fp8 import FP8, dequantize_fp8, quantize_fp8
from omnistage.models.fp8_checkpoint import Fp8Format, Fp8View, UnsupportedQuantization
from omnistage.models.qwen3_omni.thinker import Thinker
from omnistage.models.weights import Checkpoint
from omnistage.families.qwen3_omni.make_fp8 import write_fp8_variant

LAYER = "thinker.model.language_model.layers.0."


@pytest.fixture(scope="module")
def fp8_dir(tiny_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_fp8_variant(tiny_dir, tmp_path_factory.mktemp("fp8"))


def test_written_in_the_modelopt_layout(fp8_dir: Path) -> None:
    config = json.loads((fp8_dir / "config.json").read_text())
    assert config["quantization_config"]["quant_method"] == "modelopt"
    assert Fp8Format.read(fp8_dir) == Fp8Format("modelopt", block=None)
    with safe_open(str(fp8_dir / "model.safetensors"), "pt") as f:
        assert f.get_tensor(LAYER + "self_attn.q_proj.weight").dtype == FP8
        assert f.get_tensor(LAYER + "self_attn.q_proj.weight_scale").shape == ()
        assert f.get_tensor(LAYER + "mlp.experts.1.down_proj.weight").dtype == FP8
        for high in (LAYER + "mlp.gate.weight", LAYER + "input_layernorm.weight", "thinker.lm_head.weight",
                     "thinker.model.language_model.embed_tokens.weight"):
            assert f.get_tensor(high).dtype == torch.float32, high
        assert not [k for k in f.keys() if k.startswith(("talker.", "code2wav.")) and k.endswith("_scale")]


def _round_tripped_reference(tiny_dir: Path) -> Thinker:
    """The unquantized thinker with each weight the FP8 file holds replaced by its FP8 round trip."""
    model = Thinker.from_checkpoint(tiny_dir, "cpu", torch.float32)
    with torch.no_grad():
        for layer in model.decoder.layers:
            for linear in layer.self_attn.quantizable_linears():
                q, scale = quantize_fp8(linear.weight)
                linear.weight.copy_(dequantize_fp8(q, scale))
            experts = layer.mlp.experts
            for e in range(experts.num_experts):
                gate, up = experts.gate_up_proj[e].chunk(2)
                experts.gate_up_proj[e] = torch.cat([dequantize_fp8(*quantize_fp8(w)) for w in (gate, up)])
                experts.down_proj[e] = dequantize_fp8(*quantize_fp8(experts.down_proj[e]))
    return model


def _logits(model: Thinker, ids: list[int]) -> torch.Tensor:
    tensor = torch.tensor(ids)
    positions, _ = model.positions(tensor)
    meta = AttentionMetadata.for_fresh_sequences([len(ids)])
    with torch.inference_mode(), forward_context(ForwardContext(meta, TorchSDPABackend(), None)):
        return model.compute_logits(model(tensor, positions))


def test_fp8_thinker_logits_match_the_dequantised_reference(tiny_dir: Path, fp8_dir: Path) -> None:
    ids = list(range(100, 130))
    fp8 = Thinker.from_checkpoint(fp8_dir, "cpu", torch.float32)
    reference = _round_tripped_reference(tiny_dir)
    unquantized = Thinker.from_checkpoint(tiny_dir, "cpu", torch.float32)
    got, want, full = _logits(fp8, ids), _logits(reference, ids), _logits(unquantized, ids)
    # Same fp32 values, same computation; the FP8 round trip itself moves the logits visibly.
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    assert (got - full).abs().max() > 1e-4
    assert torch.equal(fp8.model.language_model.layers[0].mlp.gate.weight,
                       unquantized.model.language_model.layers[0].mlp.gate.weight)


def test_raw_view_keeps_fp8_values_and_per_row_scales(fp8_dir: Path) -> None:
    # What a GPU with FP8 GEMMs loads: values as stored, the per-tensor scale as one scale per row.
    with Checkpoint(fp8_dir) as ckpt:
        view = Fp8View(ckpt, Fp8Format.read(fp8_dir), raw=True)
        name = LAYER + "self_attn.q_proj.weight"
        weight, scale = view.get(name), view.get(LAYER + "self_attn.q_proj.weight_scale")
        assert weight.dtype == FP8 and scale.shape == (weight.shape[0],) and view.shape(name) == weight.shape
        deq = Fp8View(ckpt, Fp8Format.read(fp8_dir)).get(name)
        torch.testing.assert_close(weight.float() * scale[:, None], deq)


def test_other_quantizations_are_refused_clearly() -> None:
    with pytest.raises(UnsupportedQuantization, match="awq"):
        Fp8Format.parse({"quant_method": "awq", "bits": 4})
    with pytest.raises(UnsupportedQuantization, match="NVFP4"):
        Fp8Format.parse({"quant_method": "modelopt", "quant_algo": "NVFP4"})
    assert Fp8Format.parse({"quant_method": "fp8", "weight_block_size": [128, 128]}) == \
        Fp8Format("fp8", "weight_scale_inv", (128, 128))


def _thinker_kept_in_fp8(folder: Path) -> Thinker:
    """What ``load_checkpoint`` builds on a GPU with FP8 GEMMs (there ``raw`` follows the device; forced here)."""
    from omnistage.models.fp8_checkpoint import keep_fp8_
    from omnistage.models.build import build_on
    from omnistage.models.decoder_checkpoint import StackedExpertsView
    from omnistage.models.qwen3_omni.config import Qwen3OmniConfig
    from omnistage.models.qwen3_omni.thinker import CHECKPOINT_PREFIX
    from omnistage.models.weights import load_module

    full = Qwen3OmniConfig.from_folder(folder).hf
    with build_on("cpu", torch.float32):
        model = Thinker(full.thinker_config, full.talker_config.accept_hidden_layer)
    with Checkpoint(folder) as ckpt:
        fp8 = Fp8View(ckpt, Fp8Format.read(folder), raw=True)
        view = StackedExpertsView(fp8)
        assert keep_fp8_(model, fp8.raw_names, view.sources, CHECKPOINT_PREFIX, None) > 0
        load_module(model, view, CHECKPOINT_PREFIX, None, torch.float32)
    return model.eval().requires_grad_(False)


def test_fp8_kept_as_stored_runs_close_to_the_dequantised_model(fp8_dir: Path) -> None:
    kept = _thinker_kept_in_fp8(fp8_dir)
    layer = kept.decoder.layers[0]
    experts = layer.mlp.experts
    assert layer.self_attn.q_proj.weight.dtype == FP8 and layer.self_attn.q_proj.weight_scale.dtype == torch.float32
    assert experts.gate_up_proj.dtype == FP8 and experts.gate_up_proj_scale.shape == experts.gate_up_proj.shape[:2]
    assert layer.mlp.gate.weight.dtype == torch.float32 and layer.input_layernorm.weight.dtype == torch.float32
    ids = list(range(100, 130))
    got = _logits(kept, ids)
    want = _logits(Thinker.from_checkpoint(fp8_dir, "cpu", torch.float32), ids)
    # Same FP8 weights; the FP8 GEMMs also round each activation row to e4m3 (4 significant bits).
    torch.testing.assert_close(got, want, atol=6e-2 * float(want.abs().max()), rtol=0.0)
