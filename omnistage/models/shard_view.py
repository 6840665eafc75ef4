"""A tensor-parallel rank's view of a checkpoint: each sharded tensor read as this rank's slice.

Layers built for a rank of a tensor-parallel group say, per parameter, how their tensor is cut from the
checkpoint's (``tp_shards()``: :class:`omnistage.layers.parallel.ShardSpec`); :func:`shard_plan` gathers those
under the checkpoint's names, and :class:`ShardedView` serves them cut, so the loader's name and shape checks
and its copies work unchanged on a rank.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import torch
from torch import nn

from omnistage.layers.parallel import ShardSpec
from omnistage.models.fp8_checkpoint import TensorSource
from omnistage.models.weights import checkpoint_name


def shard_plan(model: nn.Module, prefix: str, rename: Mapping[str, str] | None) -> dict[str, ShardSpec]:
    """Checkpoint name -> how this rank's tensor is cut from it, for every sharded tensor of ``model``."""
    plan: dict[str, ShardSpec] = {}
    for path, module in model.named_modules():
        shards = getattr(module, "tp_shards", None)
        tp = getattr(module, "tp", None)
        if shards is None or tp is None or not tp.sharded:
            continue
        for local, spec in shards().items():
            names = [local]
            owner_path, _, attr = local.rpartition(".")
            owner = module.get_submodule(owner_path) if owner_path else module
            if attr == "weight" and spec.dim == 0 and owner._buffers.get("weight_scale") is not None:
                names.append(local + "_scale")  # a per-row scale (FP8 kept as stored) is cut with its rows
            for name in names:
                plan[checkpoint_name(f"{path}.{name}" if path else name, prefix, rename)] = spec
    return plan


class ShardedView:
    """``inner`` with the tensors of ``plan`` cut to this rank's slice (every other name passes through)."""

    def __init__(self, inner: TensorSource, plan: Mapping[str, ShardSpec]) -> None:
        self.folder: Path = inner.folder
        self._inner, self._plan = inner, dict(plan)

    def names(self) -> list[str]:
        return self._inner.names()

    def has(self, name: str) -> bool:
        return self._inner.has(name)

    def qualified(self, name: str) -> str:
        return self._inner.qualified(name)

    def shape(self, name: str) -> tuple[int, ...]:
        shape = self._inner.shape(name)
        spec = self._plan.get(name)
        if spec is None:
            return shape
        local = list(shape)
        local[spec.dim] //= spec.parts
        return tuple(local)

    def get(self, name: str) -> torch.Tensor:
        spec = self._plan.get(name)
        tensor = self._inner.get(name)
        return tensor if spec is None else spec.take(tensor)

    def get_rows(self, name: str, start: int, stop: int) -> torch.Tensor:
        spec = self._plan.get(name)
        if spec is None:
            return self._inner.get_rows(name, start, stop)
        if spec.dim > 0:  # the leading dimension is not cut: this rank's rows are the stored rows, cut
            return spec.take(self._inner.get_rows(name, start, stop))
        if spec.blocks == 1:  # one cut along the rows: this rank's rows are one stretch of the stored ones
            first = spec.index * self.shape(name)[0]
            return self._inner.get_rows(name, first + start, first + stop)
        return self.get(name)[start:stop]
