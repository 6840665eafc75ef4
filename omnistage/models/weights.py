"""Reading Hugging Face safetensors checkpoints and loading them into torch modules.

A :class:`Checkpoint` maps tensor names to the file that holds them and opens
files lazily, so building an index over a 60 GB sharded checkpoint reads only
headers. :func:`load_module` fills every parameter and persistent buffer of a
module from ``prefix + name``; name differences between our modules and the
checkpoint are data (a rename table), never per-model loading code.

Loading streams: each tensor is read in slices of its leading dimension (at most ``CHUNK_BYTES`` each) straight
into the tensor that keeps it, and with ``quantization="int8"`` each quantizable weight is quantized slice by
slice as it is read. A model built with :func:`omnistage.models.build.build_on` ``(..., empty=True)`` has no
storage until then, so the peak while loading is the loaded model plus one slice, never the model in full
precision (docs/memory_plan.md, "Loading").
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from math import prod
from pathlib import Path

import torch
from torch import nn
from tqdm import tqdm

from omnistage.layers.quant.apply import int8_weights, store_int8_
from omnistage.layers.quant.int8 import quantize_rows, scale_dtype
from omnistage.models.safetensors_file import SafetensorsFile

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
# How many problems one WeightLoadError spells out; the rest are counted.
MAX_REPORTED = 5
# The most bytes of one tensor read (and, quantizing, held in full precision) at a time while loading.
CHUNK_BYTES = 1 << 20


class WeightLoadError(ValueError):
    """A module's tensors could not be filled from a checkpoint; the message names each tensor."""


class Checkpoint:
    """Lazy, read-only view of the tensors in a Hugging Face checkpoint folder.

    ``subset(prefix)`` returns a view whose names have ``prefix`` stripped; it
    shares the open files with its parent.
    """

    def __init__(self, folder: str | Path) -> None:
        self.folder = Path(folder)
        self.prefix = ""
        self._handles: dict[Path, SafetensorsFile] = {}
        self._files = _index_files(self.folder, self._handles)

    # Names -----------------------------------------------------------------
    def names(self) -> list[str]:
        """Tensor names of this view, sorted."""
        return sorted(self._files)

    def has(self, name: str) -> bool:
        return name in self._files

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name in self._files

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self._files)

    def qualified(self, name: str) -> str:
        """The name as stored in the files (with the prefixes of any ``subset`` views)."""
        return self.prefix + name

    def subset(self, prefix: str) -> Checkpoint:
        """A view of the tensors whose names start with ``prefix``, with it stripped."""
        view = object.__new__(Checkpoint)
        view.folder = self.folder
        view.prefix = self.prefix + prefix
        view._files = {n[len(prefix):]: f for n, f in self._files.items() if n.startswith(prefix)}
        view._handles = self._handles
        return view

    # Tensors ---------------------------------------------------------------
    def shape(self, name: str) -> tuple[int, ...]:
        """The stored shape, read from the header only (no tensor data is touched)."""
        return self._open(name).entries[self.qualified(name)].shape

    def get(self, name: str) -> torch.Tensor:
        """The tensor on the CPU, in its stored dtype."""
        return self._open(name).read(self.qualified(name))

    def get_rows(self, name: str, start: int, stop: int) -> torch.Tensor:
        """Rows ``start:stop`` of the tensor's leading dimension (only those bytes are read)."""
        return self._open(name).read(self.qualified(name), start, stop)

    def close(self) -> None:
        """Closes the open files; later reads reopen them."""
        for handle in self._handles.values():
            handle.close()
        self._handles.clear()

    def __enter__(self) -> Checkpoint:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Checkpoint({str(self.folder)!r}, prefix={self.prefix!r}, tensors={len(self)})"

    def _open(self, name: str) -> SafetensorsFile:
        if name not in self._files:
            raise KeyError(f"no tensor {self.qualified(name)!r} in {self.folder}")
        path = self._files[name]
        if path not in self._handles:
            self._handles[path] = SafetensorsFile(path)
        return self._handles[path]


def _index_files(folder: Path, handles: dict[Path, SafetensorsFile]) -> dict[str, Path]:
    """Maps every tensor name to the file holding it, reading headers only."""
    index = folder / INDEX_FILE
    if index.is_file():
        weight_map: dict[str, str] = json.loads(index.read_text())["weight_map"]
        files = {name: folder / shard for name, shard in weight_map.items()}
        for shard in sorted(set(files.values())):
            if not shard.is_file():
                raise FileNotFoundError(f"shard {shard.name} listed in {index} does not exist")
        return files
    single = folder / SINGLE_FILE
    if single.is_file():
        handles[single] = SafetensorsFile(single)
        return {name: single for name in handles[single].keys()}
    raise FileNotFoundError(f"no {SINGLE_FILE} or {INDEX_FILE} in {folder}")


@dataclass(frozen=True)
class LoadResult:
    """What ``load_module`` did: the checkpoint names it read and those under the prefix it left."""

    loaded: tuple[str, ...]
    unused: tuple[str, ...]


def checkpoint_name(name: str, prefix: str, rename: Mapping[str, str] | None) -> str:
    """Our module's tensor name -> the checkpoint's name.

    ``rename`` maps fragments of our names to fragments of the checkpoint's
    (plain substring replacement, applied in the mapping's order), e.g.
    ``{"attn.qkv.": "attn.in_proj."}``.
    """
    for ours, theirs in (rename or {}).items():
        name = name.replace(ours, theirs)
    return prefix + name


def module_tensors(module: nn.Module) -> dict[str, torch.Tensor]:
    """Parameters and persistent buffers by name (tied parameters once, under their first name)."""
    persistent = module.state_dict(keep_vars=True).keys()
    tensors: dict[str, torch.Tensor] = dict(module.named_parameters())
    tensors.update((n, b) for n, b in module.named_buffers() if n in persistent)
    return tensors


def load_module(
    module: nn.Module,
    ckpt: Checkpoint,
    prefix: str,
    rename: Mapping[str, str] | None = None,
    dtype: torch.dtype | None = None,
    *,
    quantization: str = "none",
    device: torch.device | str | None = None,
) -> LoadResult:
    """Fills every parameter and persistent buffer of ``module`` from ``ckpt``.

    Each tensor ``name`` of the module is read from ``checkpoint_name(name,
    prefix, rename)``. All names and shapes are checked before anything is
    copied, so a failed load leaves the module untouched. Checkpoint tensors
    under ``prefix`` that the module does not use are reported in the result,
    not raised: checkpoints often carry extras (e.g. unused heads).

    ``dtype``: floating-point tensors are stored in this dtype (parameters are
    replaced in place, keeping their ``nn.Parameter`` identity); ``None`` keeps
    each tensor's current dtype. Quantized storage keeps the dtype the module
    gave it: 1-byte floats (FP8 values) and ``*_scale`` tensors. Tensors on the
    meta device (a module built without storage) get new ones on ``device``
    (default CPU), every tie of a tied parameter included; non-persistent buffers,
    which checkpoints never hold, are the builder's to make. ``quantization="int8"``
    stores every weight :func:`int8_weights` names as int8 with per-row scales,
    quantized as it is read.
    """
    tensors = module_tensors(module)
    pairs = [(checkpoint_name(n, prefix, rename), n) for n in tensors]
    _check([(ckpt_name, tensors[n]) for ckpt_name, n in pairs], ckpt)
    int8 = int8_weights(module) if quantization == "int8" else {}
    fill = _Filler(module, ckpt, dtype, torch.device(device or "cpu"))
    with torch.no_grad(), _progress(len(pairs), prefix) as bar:
        for ckpt_name, name in pairs:
            target = tensors[name]
            if name in int8 and target.is_floating_point() and target.element_size() > 1:
                fill.int8(ckpt_name, name, target, int8[name])
            else:
                fill.plain(ckpt_name, name, target)
            bar.update()
    loaded = {ckpt_name for ckpt_name, _ in pairs}
    unused = sorted(n for n in ckpt.names() if n.startswith(prefix) and n not in loaded)
    return LoadResult(loaded=tuple(sorted(loaded)), unused=tuple(unused))


def _progress(tensors: int, prefix: str) -> tqdm:
    """A bar while a module's tensors load (any checkpoint view: plain, FP8, a rank's shards), shown on a
    terminal only, so logs and tests stay clean."""
    return tqdm(total=tensors, desc=f"loading {prefix.rstrip('.') or 'weights'}", unit="tensor", disable=None,
                leave=False, mininterval=0.5)


def _check(targets: list[tuple[str, torch.Tensor]], ckpt: Checkpoint) -> None:
    problems: list[str] = []
    for name, target in targets:
        qualified = ckpt.qualified(name)
        if not ckpt.has(name):
            problems.append(f"missing tensor {qualified!r} in {ckpt.folder}")
            continue
        stored = ckpt.shape(name)
        if stored != tuple(target.shape):
            problems.append(
                f"tensor {qualified!r} has shape {stored} in the checkpoint, expected {tuple(target.shape)}"
            )
    if problems:
        shown = "; ".join(problems[:MAX_REPORTED])
        more = len(problems) - MAX_REPORTED
        raise WeightLoadError(shown + (f"; and {more} more problems" if more > 0 else ""))


def row_slices(shape: tuple[int, ...], itemsize: int) -> list[tuple[int, int]]:
    """``(start, stop)`` slices of the leading dimension of at most ``CHUNK_BYTES`` each (whole below 2-D)."""
    if len(shape) < 2:
        return [(0, shape[0] if shape else 1)]
    row_bytes = max(itemsize * (prod(shape) // max(shape[0], 1)), 1)
    step = max(CHUNK_BYTES // row_bytes, 1)
    return [(i, min(i + step, shape[0])) for i in range(0, shape[0], step)] or [(0, 0)]


class _Filler:
    """Reads one module's tensors slice by slice into their final storage (see :func:`load_module`)."""

    def __init__(self, module: nn.Module, ckpt: Checkpoint, dtype: torch.dtype | None, device: torch.device) -> None:
        self.module, self.ckpt, self.dtype, self.device = module, ckpt, dtype, device
        self.ties: dict[int, list[str]] = {}
        for name, param in module.named_parameters(remove_duplicate=False):
            self.ties.setdefault(id(param), []).append(name)

    def _want(self, name: str, target: torch.Tensor) -> torch.dtype:
        quant_storage = target.element_size() == 1 or name.endswith("_scale")
        return self.dtype if self.dtype is not None and target.is_floating_point() and not quant_storage \
            else target.dtype

    def _read(self, ckpt_name: str, shape: tuple[int, ...], itemsize: int) -> Iterator[tuple[slice, torch.Tensor]]:
        if len(shape) < 2:
            yield slice(None), self.ckpt.get(ckpt_name)
            return
        for start, stop in row_slices(shape, itemsize):
            yield slice(start, stop), self.ckpt.get_rows(ckpt_name, start, stop)

    def plain(self, ckpt_name: str, name: str, target: torch.Tensor) -> None:
        want = self._want(name, target)
        in_place = not target.is_meta and target.dtype == want
        # copy_ converts the dtype and moves to the target's device.
        dest = target if in_place else torch.empty(target.shape, dtype=want,
                                                   device=self.device if target.is_meta else target.device)
        for rows, value in self._read(ckpt_name, tuple(target.shape), want.itemsize):
            dest[rows].copy_(value)
        if in_place:
            return
        if not target.is_meta:
            target.data = dest  # .data keeps the Parameter object that optimisers or tying code may hold
            return
        if isinstance(target, nn.Parameter):
            dest = nn.Parameter(dest, requires_grad=target.requires_grad)
        # A meta tensor cannot be moved off meta in place: every name it is held under gets the new one.
        for alias in self.ties.get(id(target), [name]):
            owner_name, _, attr = alias.rpartition(".")
            setattr(self.module.get_submodule(owner_name), attr, dest)

    def int8(self, ckpt_name: str, name: str, target: torch.Tensor, where: tuple[nn.Module, str]) -> None:
        """Quantized per output row as read: a slice in the model's dtype at a time, never the whole weight."""
        want = self._want(name, target)
        device = self.device if target.is_meta else target.device
        shape = tuple(target.shape)
        q = torch.empty(shape, dtype=torch.int8, device=device)
        scale = torch.empty(shape[:-1], dtype=scale_dtype(device, want), device=device)
        for rows, value in self._read(ckpt_name, shape, want.itemsize):
            q[rows], scale[rows] = quantize_rows(value.to(device=device, dtype=want), scale.dtype)
        store_int8_(*where, q, scale)
