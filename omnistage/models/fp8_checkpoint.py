"""Pre-quantized FP8 checkpoints: recognised from ``quantization_config``, read through a view.

Recognised layouts (a weight ``X.weight`` stored as float8_e4m3fn beside its scale):

* ModelOpt (``quant_method: modelopt``, or ``hf_quant_config.json``): ``quant_algo`` ``FP8`` (a 0-d
  ``X.weight_scale`` per tensor, plus an ``X.input_scale`` for static activations, not used here),
  ``FP8_PER_CHANNEL_PER_TOKEN`` (``[N, 1]`` per row) and ``FP8_PB_WO`` (block scales);
* compressed-tensors (``quant_method: compressed-tensors``, ``format: float-quantized``): 8-bit float weights with
  ``strategy`` ``tensor``, ``channel`` or ``block`` (``block_structure``);
* ``quant_method: fp8`` with ``weight_block_size`` (DeepSeek/Qwen FP8 releases): block scales named
  ``X.weight_scale_inv`` (multiplied, despite the name).

A weight is FP8 when its checkpoint holds a scale beside it; which modules those are is the checkpoint's
business (its ``ignore``/``exclude_modules`` lists), so nothing else is configured here. :class:`Fp8View`
serves the model's loader: each FP8 weight dequantised into full precision (CPU, block scales), or kept as
stored with one float32 scale per row (``raw``: GPUs with FP8 GEMMs).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import torch
from torch import nn

from omnistage.layers.moe import FusedExperts
from omnistage.layers.quant.apply import fp8_storage_
from omnistage.layers.quant.fp8 import dequantize_fp8, row_scales, scale_layout
from omnistage.models.weights import checkpoint_name

MODELOPT_ALGOS = {"FP8": None, "FP8_PER_CHANNEL_PER_TOKEN": None, "FP8_PB_WO": (128, 128)}


class UnsupportedQuantization(ValueError):
    """A checkpoint's ``quantization_config`` names a method or layout omnistage cannot load."""


class TensorSource(Protocol):
    """What the loader reads of a checkpoint (a ``Checkpoint`` or a view over one)."""

    folder: Path

    def names(self) -> list[str]: ...

    def has(self, name: str) -> bool: ...

    def qualified(self, name: str) -> str: ...

    def shape(self, name: str) -> tuple[int, ...]: ...

    def get(self, name: str) -> torch.Tensor: ...

    def get_rows(self, name: str, start: int, stop: int) -> torch.Tensor:
        """Rows ``start:stop`` of the leading dimension; a view reads no more than it must."""
        ...


@dataclass(frozen=True)
class Fp8Format:
    method: str  # modelopt, compressed-tensors, fp8
    scale_suffix: str = "weight_scale"
    block: tuple[int, int] | None = None

    @classmethod
    def read(cls, folder: str | Path) -> Fp8Format | None:
        """The folder's FP8 format, None for an unquantized checkpoint; other quantizations are refused."""
        folder = Path(folder)
        config = json.loads((folder / "config.json").read_text())
        quant = config.get("quantization_config")
        if quant is None and (folder / "hf_quant_config.json").is_file():
            quant = {"quant_method": "modelopt",
                     **json.loads((folder / "hf_quant_config.json").read_text()).get("quantization", {})}
        return None if quant is None else cls.parse(quant)

    @classmethod
    def parse(cls, quant: dict) -> Fp8Format:
        method = str(quant.get("quant_method", "")).lower()
        if method == "modelopt":
            algo = str(quant.get("quant_algo", "")).upper()
            if algo not in MODELOPT_ALGOS:
                raise UnsupportedQuantization(f"ModelOpt quant_algo {algo!r} is not supported (FP8 only: "
                                              f"{', '.join(MODELOPT_ALGOS)})")
            block = quant.get("block_size") or MODELOPT_ALGOS[algo]
            return cls("modelopt", block=tuple(block) if block else None)
        if method == "compressed-tensors":
            return cls("compressed-tensors", block=_compressed_tensors_block(quant))
        if method == "fp8":
            block = quant.get("weight_block_size")
            return cls("fp8", scale_suffix="weight_scale_inv" if block else "weight_scale",
                       block=tuple(block) if block else None)
        raise UnsupportedQuantization(f"quantization method {method!r} is not supported; omnistage loads FP8 "
                                      f"checkpoints (modelopt, compressed-tensors, fp8) and quantizes int8 itself")


def _compressed_tensors_block(quant: dict) -> tuple[int, int] | None:
    block = None
    for name, group in (quant.get("config_groups") or {}).items():
        weights = group.get("weights") or {}
        if weights.get("type") != "float" or weights.get("num_bits") != 8:
            raise UnsupportedQuantization(f"compressed-tensors group {name!r}: only 8-bit float weights are "
                                          f"supported, not {weights.get('num_bits')}-bit {weights.get('type')}")
        if weights.get("strategy") == "block":
            block = tuple(weights.get("block_structure") or (128, 128))
    return block


class Fp8View:
    """A checkpoint as full-precision tensors where it stores FP8 ones, or (``raw``) FP8 values and per-row
    float32 scales under ``X.weight_scale``. Block-scaled weights are always dequantised."""

    def __init__(self, inner: TensorSource, fmt: Fp8Format, raw: bool = False) -> None:
        self.folder, self._inner, self.fmt = inner.folder, inner, fmt
        names = set(inner.names())
        suffix = "." + fmt.scale_suffix
        self._scales = {n[: -len(suffix)] + ".weight": n for n in names if n.endswith(suffix)}
        self._scales = {w: s for w, s in self._scales.items() if w in names}
        companions = set(self._scales.values()) | {w[: -len(".weight")] + ".input_scale" for w in self._scales}
        self.raw_names = {w for w in self._scales if raw and self._layout(w) != "block"}
        # Our per-row scale's name -> its weight's (the same name as ModelOpt's 0-d scale: it replaces it).
        self._raw_scales = {w[: -len(".weight")] + ".weight_scale": w for w in self.raw_names}
        self._names = sorted((names - companions) | set(self._raw_scales))

    @property
    def fp8_names(self) -> set[str]:
        return set(self._scales)

    def _layout(self, weight: str) -> str:
        scale_shape = self._inner.shape(self._scales[weight])
        return scale_layout(torch.empty(scale_shape, device="meta"), self._inner.shape(weight)[-2:], self.fmt.block)

    def names(self) -> list[str]:
        return list(self._names)

    def has(self, name: str) -> bool:
        return name in self._raw_scales or (name in self._names and self._inner.has(name))

    def qualified(self, name: str) -> str:
        return self._inner.qualified(name)

    def shape(self, name: str) -> tuple[int, ...]:
        if name in self._raw_scales:
            return self._inner.shape(self._raw_scales[name])[:-1]
        return self._inner.shape(name)

    def get(self, name: str) -> torch.Tensor:
        if name in self._raw_scales:
            weight = self._raw_scales[name]
            return row_scales(self._inner.get(self._scales[weight]), self._inner.shape(weight)[0])
        if name in self._scales and name not in self.raw_names:
            return dequantize_fp8(self._inner.get(name), self._inner.get(self._scales[name]), self.fmt.block)
        return self._inner.get(name)

    def get_rows(self, name: str, start: int, stop: int) -> torch.Tensor:
        if name in self._raw_scales:
            return self.get(name)[start:stop]  # one float per row: small
        if name not in self._scales or name in self.raw_names:
            return self._inner.get_rows(name, start, stop)
        # Only these rows are dequantised: from the first row of their block, with their scale rows.
        scale = self._inner.get(self._scales[name])
        n, k = self._inner.shape(name)[-2:]
        layout = scale_layout(scale, (n, k), self.fmt.block)
        first = start - start % self.fmt.block[0] if layout == "block" else start
        if layout == "row":
            scale = scale.reshape(n, -1)[start:stop]
        elif layout == "block":
            scale = scale[first // self.fmt.block[0]:-(-stop // self.fmt.block[0])]
        rows = dequantize_fp8(self._inner.get_rows(name, first, stop), scale, self.fmt.block)
        return rows[start - first:]


def keep_fp8_(model: nn.Module, raw_names: set[str], sources: Callable[[str], list[str]], prefix: str,
              rename: Mapping[str, str] | None) -> int:
    """Gives every linear and fused-expert tensor whose stored weights all stay FP8 (``raw_names``; ``sources``
    maps a name the model loads to the stored tensors it is made of) an FP8 tensor and a per-row scale to be
    loaded into. Returns how many were converted."""
    count = 0
    for path, module in model.named_modules():
        attrs = ("weight",) if isinstance(module, nn.Linear) else (
            ("gate_up_proj", "down_proj") if isinstance(module, FusedExperts) else ())
        for attr in attrs:
            name = checkpoint_name(f"{path}.{attr}" if path else attr, prefix, rename)
            if all(source in raw_names for source in sources(name)):
                fp8_storage_(module, attr)
                count += 1
    return count
