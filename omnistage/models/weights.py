"""Reading Hugging Face safetensors checkpoints and loading them into torch modules.

A :class:`Checkpoint` maps tensor names to the file that holds them and opens
files lazily, so building an index over a 60 GB sharded checkpoint reads only
headers. :func:`load_module` fills every parameter and persistent buffer of a
module from ``prefix + name``; name differences between our modules and the
checkpoint are data (a rename table), never per-model loading code.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open
from torch import nn
from tqdm import tqdm

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
# How many problems one WeightLoadError spells out; the rest are counted.
MAX_REPORTED = 5


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
        self._files = _index_files(self.folder)
        self._handles: dict[Path, object] = {}

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
        return tuple(self._open(name).get_slice(self.qualified(name)).get_shape())

    def get(self, name: str) -> torch.Tensor:
        """The tensor on the CPU, in its stored dtype."""
        return self._open(name).get_tensor(self.qualified(name))

    def close(self) -> None:
        """Drops the open file handles; later reads reopen them."""
        self._handles.clear()

    def __enter__(self) -> Checkpoint:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Checkpoint({str(self.folder)!r}, prefix={self.prefix!r}, tensors={len(self)})"

    def _open(self, name: str):  # noqa: ANN202 - safetensors' handle type is not exported
        if name not in self._files:
            raise KeyError(f"no tensor {self.qualified(name)!r} in {self.folder}")
        path = self._files[name]
        if path not in self._handles:
            self._handles[path] = safe_open(str(path), framework="pt", device="cpu")
        return self._handles[path]


def _index_files(folder: Path) -> dict[str, Path]:
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
        with safe_open(str(single), framework="pt", device="cpu") as handle:
            return {name: single for name in handle.keys()}
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
    gave it: 1-byte floats (FP8 values) and ``*_scale`` tensors. Modules built on the meta device get CPU
    tensors (parameter ties are not kept there); their non-persistent buffers,
    which checkpoints never hold, stay on meta for the caller to rebuild.
    """
    tensors = module_tensors(module)
    pairs = [(checkpoint_name(n, prefix, rename), n) for n in tensors]
    _check([(ckpt_name, tensors[n]) for ckpt_name, n in pairs], ckpt)
    with torch.no_grad(), _progress(len(pairs), prefix) as bar:
        for ckpt_name, name in pairs:
            _assign(module, name, tensors[name], ckpt.get(ckpt_name), dtype)
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


def _assign(
    module: nn.Module, name: str, target: torch.Tensor, value: torch.Tensor, dtype: torch.dtype | None
) -> None:
    quant_storage = target.element_size() == 1 or name.endswith("_scale")
    want = dtype if dtype is not None and target.is_floating_point() and not quant_storage else target.dtype
    if target.is_meta:
        # A meta tensor has no storage to copy into, and .data cannot move it
        # off the meta device: the owner gets a new tensor under the same name.
        owner_name, _, attr = name.rpartition(".")
        owner = module.get_submodule(owner_name)
        value = value.to(dtype=want, copy=True)
        if isinstance(target, nn.Parameter):
            value = nn.Parameter(value, requires_grad=target.requires_grad)
        setattr(owner, attr, value)
    elif target.dtype == want:
        target.copy_(value)  # copy_ converts dtype and moves to the target's device
    else:
        # .data keeps the Parameter object that optimisers or tying code may hold.
        target.data = value.to(device=target.device, dtype=want, copy=True)
