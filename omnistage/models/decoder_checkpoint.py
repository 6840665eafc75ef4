"""Filling a Qwen3 decoder model (:mod:`omnistage.models.decoder`'s modules, or any model whose names mirror
transformers') from a checkpoint in either layout: transformers' runtime names with fused expert tensors, or the
hub layout of released files (other prefixes, one tensor per expert, stacked on read by
:class:`StackedExpertsView`). FP8 checkpoints, tensor-parallel shards and int8-as-read go through the same call.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path

import torch
from torch import nn

from omnistage.layers.quant.fp8 import fp8_gemm_supported
from omnistage.models.build import assert_materialized
from omnistage.models.fp8_checkpoint import Fp8Format, Fp8View, keep_fp8_
from omnistage.models.shard_view import ShardedView, shard_plan
from omnistage.models.weights import Checkpoint, load_module, module_tensors


def load_checkpoint(
    model: nn.Module, folder: str | Path, prefix: str, dtype: torch.dtype, hub_names: Mapping[str, str],
    quantization: str = "none", device: torch.device | str | None = None,
) -> None:
    """Fills ``model`` from either checkpoint layout.

    * transformers' runtime layout (``state_dict()`` of its modules, e.g. the
      tiny checkpoint): our names, fused expert tensors;
    * the hub layout (Qwen's released files, and what ``save_pretrained``
      writes): some prefixes differ (``hub_names``: our fragment -> theirs) and
      experts are stored one tensor per expert, stacked here on read.

    An FP8 checkpoint (:mod:`omnistage.models.fp8_checkpoint`) is dequantised on read, or on GPUs with FP8 GEMMs
    its per-tensor/per-row weights are kept in FP8; a model built for a tensor-parallel rank reads its shards.
    ``quantization="int8"`` quantizes the decoder weights as they are read; ``device``: where a model built
    ``empty`` (:func:`omnistage.models.build.build_on`) gets its tensors (default: where its parameters are).
    """
    fmt = Fp8Format.read(folder)
    if device is None:
        device = next(model.parameters()).device
    device = torch.device(device)
    with Checkpoint(folder) as ckpt:
        fp8 = Fp8View(ckpt, fmt, raw=fp8_gemm_supported(device)) if fmt is not None else None
        view = StackedExpertsView(fp8 or ckpt)
        runtime_layout = all(view.has(prefix + name) for name in module_tensors(model))
        rename = None if runtime_layout else hub_names
        if fp8 is not None and fp8.raw_names:
            keep_fp8_(model, fp8.raw_names, view.sources, prefix, rename)
        plan = shard_plan(model, prefix, rename)
        load_module(model, ShardedView(view, plan) if plan else view, prefix, rename, dtype,  # type: ignore[arg-type]
                    quantization=quantization, device=device)
    assert_materialized(model)


_PER_EXPERT = re.compile(
    r"^(?P<base>.*\.experts\.)(?P<expert>\d+)\.(?P<proj>gate|up|down)_proj\.(?P<kind>weight|weight_scale)$")
_FUSED_SUFFIX = {"weight": "", "weight_scale": "_scale"}  # an FP8 checkpoint's per-row scales stack like weights


class StackedExpertsView:
    """A checkpoint view where per-expert tensors (``experts.{e}.gate_proj.weight``, ...) read as the fused
    ``experts.gate_up_proj [E, 2I, H]`` (gate rows, then up rows) and ``experts.down_proj [E, H, I]``.

    Every other name passes through unchanged, so it is a no-op on checkpoints that already store fused tensors.
    Per-expert per-row scales (``experts.{e}.gate_proj.weight_scale``, an FP8 checkpoint kept in FP8) read as
    ``experts.gate_up_proj_scale [E, 2I]`` and ``experts.down_proj_scale [E, H]``.
    It offers what :func:`load_module` reads of a :class:`Checkpoint`: folder, names, has, qualified, shape, get.
    """

    def __init__(self, ckpt: Checkpoint) -> None:
        self.folder, self._inner = ckpt.folder, ckpt
        groups: dict[tuple[str, str], dict[int, dict[str, str]]] = {}
        for name in ckpt.names():
            if match := _PER_EXPERT.match(name):
                group = groups.setdefault((match["base"], _FUSED_SUFFIX[match["kind"]]), {})
                group.setdefault(int(match["expert"]), {})[match["proj"]] = name
        self._fused: dict[str, list[list[str]]] = {}
        for (base, suffix), experts in groups.items():
            ordered = [experts.get(e, {}) for e in range(max(experts) + 1)]
            if any(set(parts) != {"gate", "up", "down"} for parts in ordered):
                raise ValueError(f"experts under {ckpt.qualified(base)!r} lack some gate/up/down tensors")
            self._fused[base + "gate_up_proj" + suffix] = [[parts["gate"], parts["up"]] for parts in ordered]
            self._fused[base + "down_proj" + suffix] = [[parts["down"]] for parts in ordered]
        self._sources = {n for lists in self._fused.values() for names in lists for n in names}

    def sources(self, name: str) -> list[str]:
        """The stored tensors ``name`` is made of (itself when it is not a stacked one)."""
        return [n for names in self._fused[name] for n in names] if name in self._fused else [name]

    def names(self) -> list[str]:
        return sorted((set(self._inner.names()) - self._sources) | set(self._fused))

    def has(self, name: str) -> bool:
        return name in self._fused or self._inner.has(name)

    def qualified(self, name: str) -> str:
        return self._inner.qualified(name)

    def shape(self, name: str) -> tuple[int, ...]:
        if name not in self._fused:
            return self._inner.shape(name)
        first = self._fused[name][0]
        rows = sum(self._inner.shape(part)[0] for part in first)
        return (len(self._fused[name]), rows, *self._inner.shape(first[0])[1:])

    def get(self, name: str) -> torch.Tensor:
        return self.get_rows(name, 0, len(self._fused[name])) if name in self._fused else self._inner.get(name)

    def get_rows(self, name: str, start: int, stop: int) -> torch.Tensor:
        """Experts ``start:stop`` of a stacked tensor (only theirs are read); rows of any other."""
        if name not in self._fused:
            return self._inner.get_rows(name, start, stop)
        return torch.stack([torch.cat([self._inner.get(p) for p in parts]) for parts in self._fused[name][start:stop]])

