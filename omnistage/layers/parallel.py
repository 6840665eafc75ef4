"""Tensor parallelism inside the layers: which slice of each weight a rank holds, and where partial sums meet.

Megatron's scheme, as vLLM runs it:

* column parallel (q/k/v, gate/up, the experts' gate_up): the output rows are split, each rank computes its own
  heads or its share of the intermediate dimension from the whole input;
* row parallel (o_proj, down, the experts' down): the input columns are split, each rank's output is a partial
  sum, and one all-reduce per attention block and one per MLP block adds them up.

Experts are split by their intermediate dimension, not by expert: every rank holds ``1/N`` of every expert, so
a decode step reads ``1/N`` of each active expert on each rank whatever the router picked (split by expert, one
rank would read all of a popular expert while the others wait), and the per-expert kernels run unchanged.

A rank's tensors are cut from the checkpoint's by a :class:`ShardSpec` per parameter (the loader reads only
that slice); :class:`TensorParallel` is what a layer is built with: its rank, the group size and the group that
all-reduces. Rank 0 of a size-1 group is the unsharded model.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import torch


class ReduceGroup(Protocol):
    """The collective a layer needs: sums ``x`` over the ranks, in place (every rank gets the same bits)."""

    def all_reduce(self, x: torch.Tensor) -> None: ...


@dataclass(frozen=True)
class ShardSpec:
    """How a rank's tensor is cut from the checkpoint's.

    Along ``dim`` the stored tensor is ``blocks`` equal blocks laid end to end (the experts' ``gate_up_proj``:
    gate rows then up rows, 2 blocks); each block is cut into ``parts`` equal parts and the rank holds part
    ``index`` of every block, in block order. ``parts`` may be smaller than the group (KV heads replicated when
    there are fewer KV heads than ranks).
    """

    dim: int
    parts: int
    index: int
    blocks: int = 1

    def full_shape(self, local: tuple[int, ...]) -> tuple[int, ...]:
        shape = list(local)
        shape[self.dim] *= self.parts
        return tuple(shape)

    def take(self, full: torch.Tensor) -> torch.Tensor:
        """This rank's slice of the whole tensor (contiguous)."""
        size = full.shape[self.dim]
        if size % (self.blocks * self.parts):
            raise ValueError(f"dimension {self.dim} of size {size} does not split into {self.blocks} blocks "
                             f"of {self.parts} parts")
        block = size // self.blocks
        part = block // self.parts
        pieces = [full.narrow(self.dim, b * block + self.index * part, part) for b in range(self.blocks)]
        return torch.cat(pieces, dim=self.dim) if len(pieces) > 1 else pieces[0].contiguous()


@dataclass(frozen=True)
class HeadSplit:
    """A rank's attention heads: ``q`` query heads and ``kv`` KV heads, and the slices they are cut as."""

    q: int
    kv: int
    q_shard: ShardSpec
    kv_shard: ShardSpec


@dataclass(frozen=True)
class TensorParallel:
    """A layer's place in its tensor-parallel group; the default is the unsharded model (rank 0 of 1)."""

    rank: int = 0
    size: int = 1
    group: ReduceGroup | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.size < 1 or not 0 <= self.rank < self.size:
            raise ValueError(f"tensor-parallel rank {self.rank} outside a group of {self.size}")

    @property
    def sharded(self) -> bool:
        return self.size > 1

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` summed over the ranks (in place); the identity on one rank."""
        if self.size > 1:
            if self.group is None:
                raise RuntimeError("a sharded layer ran without its tensor-parallel group")
            self.group.all_reduce(x)
        return x

    def split(self, n: int, what: str) -> int:
        """This rank's share of ``n`` (an intermediate size, a head count), which must divide evenly."""
        if n % self.size:
            raise ValueError(f"{what}={n} does not split over tensor_parallel_size={self.size}")
        return n // self.size

    def columns(self, blocks: int = 1, dim: int = 0) -> ShardSpec:
        """Column parallel (output rows split), e.g. gate/up, or ``blocks=2`` for a fused gate_up."""
        return ShardSpec(dim, self.size, self.rank, blocks)

    def rows(self, dim: int = 1) -> ShardSpec:
        """Row parallel (input columns split): o_proj, down."""
        return ShardSpec(dim, self.size, self.rank)

    def heads(self, num_heads: int, num_kv_heads: int) -> HeadSplit:
        """Query heads split evenly; KV heads split too, or replicated when there are fewer than ranks (each
        rank then holds the one KV head its query heads read, as vLLM does)."""
        q = self.split(num_heads, "num_attention_heads")
        if num_kv_heads % self.size == 0:
            kv_parts, kv_index = self.size, self.rank
        elif self.size % num_kv_heads == 0:
            kv_parts, kv_index = num_kv_heads, self.rank * num_kv_heads // self.size
        else:
            raise ValueError(f"num_key_value_heads={num_kv_heads} and tensor_parallel_size={self.size}: one must "
                             f"divide the other")
        return HeadSplit(q, num_kv_heads // kv_parts, self.columns(), ShardSpec(0, kv_parts, kv_index))


UNSHARDED = TensorParallel()
