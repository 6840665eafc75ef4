"""Checkpoint reading and load_module: names, shapes, shards, renames and the errors that name tensors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from torch import nn

from omnistage.models.codec_transformer import Code2WavConfig
from omnistage.models.qwen3_omni.code2wav import Code2Wav
from omnistage.models.weights import Checkpoint, WeightLoadError, load_module

CONV = "code2wav.decoder.0.conv.weight"


def _code2wav(tiny_dir: Path) -> Code2Wav:
    config = json.loads((tiny_dir / "config.json").read_text())["code2wav_config"]
    return Code2Wav(Code2WavConfig.from_hf(config))


def _copy_with(tiny_dir: Path, out: Path, edit) -> Path:  # noqa: ANN001 - edit: dict -> None
    """A copy of the tiny checkpoint's weights with ``edit`` applied to the tensor dict."""
    tensors = load_file(str(tiny_dir / "model.safetensors"))
    edit(tensors)
    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out / "model.safetensors"))
    return out


def _shard(tiny_dir: Path, out: Path) -> Path:
    """The tiny checkpoint split into two shards plus an index, as large HF checkpoints are stored."""
    tensors = load_file(str(tiny_dir / "model.safetensors"))
    names = sorted(tensors)
    halves = {"model-00001-of-00002.safetensors": names[::2], "model-00002-of-00002.safetensors": names[1::2]}
    out.mkdir(parents=True, exist_ok=True)
    for file, part in halves.items():
        save_file({n: tensors[n] for n in part}, str(out / file))
    weight_map = {n: file for file, part in halves.items() for n in part}
    (out / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return out


def test_checkpoint_names_get_and_subset(tiny_dir: Path) -> None:
    ckpt = Checkpoint(tiny_dir)
    reference = load_file(str(tiny_dir / "model.safetensors"))
    assert ckpt.names() == sorted(reference) and len(ckpt) == len(reference)
    assert ckpt.has(CONV) and CONV in ckpt and not ckpt.has("nope")
    assert torch.equal(ckpt.get(CONV), reference[CONV])
    assert ckpt.shape(CONV) == tuple(reference[CONV].shape)
    sub = ckpt.subset("code2wav.")
    assert sub.names() == sorted(n[len("code2wav."):] for n in reference if n.startswith("code2wav."))
    assert torch.equal(sub.get("decoder.0.conv.weight"), reference[CONV])
    assert sub.qualified("decoder.0.conv.weight") == CONV
    with pytest.raises(KeyError, match="code2wav.nope"):
        sub.get("nope")


def test_no_weights_is_file_not_found(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="model.safetensors"):
        Checkpoint(tmp_path)


def test_load_module_copies_every_tensor(tiny_dir: Path) -> None:
    model = _code2wav(tiny_dir)
    result = load_module(model, Checkpoint(tiny_dir), "code2wav.")
    reference = load_file(str(tiny_dir / "model.safetensors"))
    state = model.state_dict()
    assert "code_offset" not in state  # non-persistent buffers are not read from checkpoints
    for name, tensor in state.items():
        assert torch.equal(tensor, reference["code2wav." + name]), name
    assert len(result.loaded) == len(state) and result.unused == ()


def test_missing_tensor_is_named(tiny_dir: Path, tmp_path: Path) -> None:
    folder = _copy_with(tiny_dir, tmp_path / "ckpt", lambda t: t.pop(CONV))
    model = _code2wav(tiny_dir)
    before = {n: t.clone() for n, t in model.state_dict().items()}
    with pytest.raises(WeightLoadError, match=f"missing tensor '{CONV}' in {folder}"):
        load_module(model, Checkpoint(folder), "code2wav.")
    # Checked before copying: a failed load leaves the module as it was.
    assert all(torch.equal(before[n], t) for n, t in model.state_dict().items())


def test_wrong_shape_is_named(tiny_dir: Path, tmp_path: Path) -> None:
    def widen(tensors: dict[str, torch.Tensor]) -> None:
        tensors[CONV] = torch.zeros(32, 32, 5)

    folder = _copy_with(tiny_dir, tmp_path / "ckpt", widen)
    expected = f"tensor '{CONV}' has shape (32, 32, 5) in the checkpoint, expected (32, 32, 7)"
    with pytest.raises(WeightLoadError, match=expected.replace("(", r"\(").replace(")", r"\)")):
        load_module(_code2wav(tiny_dir), Checkpoint(folder), "code2wav.")


def test_many_problems_in_one_error(tiny_dir: Path, tmp_path: Path) -> None:
    def drop_decoder(tensors: dict[str, torch.Tensor]) -> None:
        for name in [n for n in tensors if n.startswith("code2wav.decoder.")]:
            del tensors[name]

    folder = _copy_with(tiny_dir, tmp_path / "ckpt", drop_decoder)
    with pytest.raises(WeightLoadError) as info:
        load_module(_code2wav(tiny_dir), Checkpoint(folder), "code2wav.")
    message = str(info.value)
    assert message.count("missing tensor") == 5 and "more problems" in message
    assert isinstance(info.value, ValueError)


def test_sharded_index_loads_like_single_file(tiny_dir: Path, tmp_path: Path) -> None:
    sharded = Checkpoint(_shard(tiny_dir, tmp_path / "sharded"))
    single = Checkpoint(tiny_dir)
    assert sharded.names() == single.names()
    a, b = _code2wav(tiny_dir), _code2wav(tiny_dir)
    load_module(a, sharded, "code2wav.")
    load_module(b, single, "code2wav.")
    for (name, x), y in zip(a.state_dict().items(), b.state_dict().values()):
        assert torch.equal(x, y), name


def test_missing_shard_is_file_not_found(tiny_dir: Path, tmp_path: Path) -> None:
    folder = _shard(tiny_dir, tmp_path / "sharded")
    (folder / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match="model-00002-of-00002"):
        Checkpoint(folder)


class _Toy(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(3, 2)
        self.register_buffer("scale", torch.zeros(2))  # persistent: must come from the checkpoint
        self.register_buffer("cache", torch.zeros(4), persistent=False)  # never read


def _toy_checkpoint(folder: Path) -> dict[str, torch.Tensor]:
    tensors = {
        "m.block.linear.weight": torch.randn(2, 3), "m.block.linear.bias": torch.randn(2),
        "m.scale": torch.randn(2), "m.extra": torch.randn(5), "other.weight": torch.randn(1),
    }
    folder.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(folder / "model.safetensors"))
    return tensors


def test_rename_buffers_and_extras(tmp_path: Path) -> None:
    tensors = _toy_checkpoint(tmp_path)
    toy = _Toy()
    result = load_module(toy, Checkpoint(tmp_path), "m.", rename={"proj.": "block.linear."})
    assert torch.equal(toy.proj.weight, tensors["m.block.linear.weight"])
    assert torch.equal(toy.proj.bias, tensors["m.block.linear.bias"])
    assert torch.equal(toy.scale, tensors["m.scale"])
    assert result.unused == ("m.extra",)  # extras under the prefix are reported, not raised
    with pytest.raises(WeightLoadError, match="missing tensor 'm.proj.weight'"):
        load_module(_Toy(), Checkpoint(tmp_path), "m.")


def test_dtype_and_meta_device(tmp_path: Path) -> None:
    tensors = _toy_checkpoint(tmp_path)
    rename = {"proj.": "block.linear."}
    toy = _Toy()
    weight = toy.proj.weight
    load_module(toy, Checkpoint(tmp_path), "m.", rename=rename, dtype=torch.bfloat16)
    assert toy.proj.weight is weight and weight.dtype == torch.bfloat16
    assert torch.equal(weight, tensors["m.block.linear.weight"].bfloat16())
    with torch.device("meta"):
        lazy = _Toy()
    load_module(lazy, Checkpoint(tmp_path), "m.", rename=rename)
    assert isinstance(lazy.proj.weight, nn.Parameter) and lazy.proj.weight.device.type == "cpu"
    assert torch.equal(lazy.proj.weight, tensors["m.block.linear.weight"])
    assert torch.equal(lazy.scale, tensors["m.scale"])
