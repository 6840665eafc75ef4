"""Loading by slices: the positioned safetensors reader, models built without storage, int8 quantized as read."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from torch import nn

from omnistage.layers.quant.apply import quantize_int8_
from omnistage.layers.quant.fp8 import quantize_fp8
from omnistage.models import weights
from omnistage.models.build import assert_materialized, build_on
from omnistage.models.decoder_checkpoint import load_checkpoint
from omnistage.models.fp8_checkpoint import Fp8Format, Fp8View
from omnistage.models.qwen3_omni.config import Qwen3OmniConfig
from omnistage.models.qwen3_omni.talker import CHECKPOINT_PREFIX as TALKER_PREFIX
from omnistage.models.qwen3_omni.talker import Talker
from omnistage.models.qwen3_omni.thinker import CHECKPOINT_PREFIX, HUB_NAMES, Thinker
from omnistage.models.safetensors_file import SafetensorsFile
from omnistage.models.weights import Checkpoint, load_module


def test_reader_returns_what_safetensors_stored_whole_and_by_rows(tmp_path: Path) -> None:
    g = torch.Generator().manual_seed(0)
    tensors = {
        "bf16": torch.randn(7, 3, 5, generator=g).bfloat16(), "f32": torch.randn(9, 4, generator=g),
        "fp8": torch.randn(6, 8, generator=g).to(torch.float8_e4m3fn), "i64": torch.arange(11),
        "flag": torch.tensor([True, False, True]), "scalar": torch.tensor(2.5), "empty": torch.zeros(0, 4),
    }
    save_file(tensors, str(tmp_path / "x.safetensors"), metadata={"format": "pt"})
    stored = load_file(str(tmp_path / "x.safetensors"))
    f = SafetensorsFile(tmp_path / "x.safetensors")
    for name, t in stored.items():
        got = f.read(name)
        assert got.dtype == t.dtype and got.shape == t.shape
        assert torch.equal(got.reshape(-1).view(torch.uint8), t.reshape(-1).view(torch.uint8)), name
    assert torch.equal(f.read("bf16", 2, 5), stored["bf16"][2:5])
    assert torch.equal(f.read("f32", 8, 100), stored["f32"][8:])
    f.close()


@pytest.mark.parametrize("quantization", ["none", "int8"])
def test_thinker_loaded_empty_and_quantized_as_read_equals_load_then_quantize(
        medium_dir: Path, quantization: str) -> None:
    # The medium checkpoint's experts (16 MiB each in fp32) are read and quantized in 16 slices.
    assert weights.CHUNK_BYTES < 16 << 20
    new = Thinker.from_checkpoint(medium_dir, "cpu", torch.float32, quantization=quantization)
    full = Qwen3OmniConfig.from_folder(medium_dir).hf
    with build_on("cpu", torch.float32):
        old = Thinker(full.thinker_config, full.talker_config.accept_hidden_layer)
    load_checkpoint(old, medium_dir, CHECKPOINT_PREFIX, torch.float32, HUB_NAMES)
    if quantization == "int8":
        assert quantize_int8_(old) > 0
    a, b = old.state_dict(), new.state_dict()
    assert a.keys() == b.keys()
    for name in a:  # the same computation row by row: bit-exact
        assert a[name].dtype == b[name].dtype and torch.equal(a[name], b[name]), name
    if quantization == "int8":
        assert quantize_int8_(new) == 0  # nothing left in full precision to quantize


def test_empty_build_leaves_weights_without_storage_and_computed_buffers_real(tiny_dir: Path) -> None:
    full = Qwen3OmniConfig.from_folder(tiny_dir).hf
    with build_on("cpu", torch.float32, empty=True):
        talker = Talker(full.talker_config)
    params = list(talker.parameters())
    meta = sum(p.numel() for p in params if p.is_meta)
    assert meta > 0.95 * sum(p.numel() for p in params)
    assert not any(b.is_meta for b in talker.buffers())  # RoPE frequencies are computed, not loaded
    with pytest.raises(RuntimeError, match="left without storage"):
        assert_materialized(talker)
    load_checkpoint(talker, tiny_dir, TALKER_PREFIX, torch.float32, {}, "int8", "cpu")
    assert_materialized(talker)


def test_a_tied_parameter_built_empty_is_filled_under_every_name(tmp_path: Path) -> None:
    class Tied(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Embedding(10, 4)
            self.head = nn.Linear(4, 10, bias=False)
            self.head.weight = self.embed.weight

    value = torch.randn(10, 4)
    save_file({"m.embed.weight": value}, str(tmp_path / "model.safetensors"))
    with build_on("cpu", torch.float32, empty=True):
        tied = Tied()
    load_module(tied, Checkpoint(tmp_path), "m.")
    assert tied.head.weight is tied.embed.weight and torch.equal(tied.head.weight, value)


@pytest.mark.parametrize("layout", ["tensor", "row", "block"])
def test_fp8_weights_dequantise_by_rows_as_whole(tmp_path: Path, layout: str) -> None:
    w = torch.randn(300, 260, generator=torch.Generator().manual_seed(1))
    if layout == "row":
        scale = w.abs().amax(1, keepdim=True) / 448
        q, fmt, scale_name = (w / scale).to(torch.float8_e4m3fn), Fp8Format("modelopt"), "x.weight_scale"
    else:
        block = (128, 128) if layout == "block" else None
        q, scale = quantize_fp8(w, block)
        fmt = Fp8Format("fp8", scale_suffix="weight_scale_inv", block=block) if block else Fp8Format("modelopt")
        scale_name = "x.weight_scale_inv" if block else "x.weight_scale"
    save_file({"x.weight": q, scale_name: scale}, str(tmp_path / "model.safetensors"))
    view = Fp8View(Checkpoint(tmp_path), fmt)
    whole = view.get("x.weight")
    for start, stop in ((0, 300), (5, 140), (130, 131), (128, 256), (255, 300)):
        assert torch.equal(view.get_rows("x.weight", start, stop), whole[start:stop]), (start, stop)
