"""The contract between a stage's runner and its model's attention layers.

A forward pass sees one *flattened* batch: ``T`` new tokens from ``N``
sequences laid end to end. ``AttentionMetadata`` says where each sequence's
tokens start, how long its context is once they are added, and where in the
paged KV cache each new token's key/value goes. Models never build this; the
runner does, and publishes it through :mod:`omnistage.layers.attention.context`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field

import torch


@dataclass
class AttentionMetadata:
    """One step's attention layout for ``N`` sequences and ``T`` new tokens.

    query_start_loc: int32 [N+1], cumulative new-token counts (sequence i owns rows
        ``query_start_loc[i]:query_start_loc[i+1]`` of q/k/v).
    context_lens: int32 [N], tokens in the cache for sequence i *after* this step
        (cached prefix + new tokens). New tokens sit at the end of the context.
    slot_mapping: int64 [T], flat cache slot (``block * block_size + offset``) for
        each new token's key/value; -1 means "do not store" (padding rows).
    block_tables: int32 [N, max_blocks], the cache blocks of each sequence, in order;
        unused entries are 0. May be None when ``kv_caches`` are absent.
    query_lens / context_lens_cpu: the same lengths as Python lists, so the CPU
        path never syncs on a tensor to learn a shape.
    """

    query_start_loc: torch.Tensor
    context_lens: torch.Tensor
    slot_mapping: torch.Tensor
    block_tables: torch.Tensor | None
    query_lens: list[int]
    context_lens_cpu: list[int]
    # block_tables as lists, made once per step on first use (every layer reads the same tables).
    _table_rows: list[list[int]] | None = field(default=None, init=False, repr=False, compare=False)
    # The decode sequences' indices and rows (int32), made once per step on first use.
    _decode_index: tuple[torch.Tensor, torch.Tensor] | None = field(default=None, init=False, repr=False,
                                                                    compare=False)

    def block_table_rows(self) -> list[list[int]]:
        if self._table_rows is None:
            self._table_rows = [] if self.block_tables is None else self.block_tables.tolist()
        return self._table_rows

    def decode_index(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(sequences, rows)``: which sequences have one new token, and the row of q each one's token is on."""
        if self._decode_index is None:
            seqs = [i for i, n in enumerate(self.query_lens) if n == 1]
            starts = self.query_start_loc.tolist()
            self._decode_index = (torch.tensor(seqs, dtype=torch.int32),
                                  torch.tensor([starts[i] for i in seqs], dtype=torch.int32))
        return self._decode_index

    @property
    def num_seqs(self) -> int:
        return len(self.query_lens)

    @property
    def is_decode_only(self) -> bool:
        return all(q == 1 for q in self.query_lens)

    @classmethod
    def for_fresh_sequences(cls, lengths: list[int], device: torch.device | str = "cpu") -> AttentionMetadata:
        """Metadata for sequences with no cache (whole prompts at once, nothing stored)."""
        starts = [0]
        for n in lengths:
            starts.append(starts[-1] + n)
        total = starts[-1]
        return cls(
            query_start_loc=torch.tensor(starts, dtype=torch.int32, device=device),
            context_lens=torch.tensor(lengths, dtype=torch.int32, device=device),
            slot_mapping=torch.full((total,), -1, dtype=torch.int64, device=device),
            block_tables=None,
            query_lens=list(lengths),
            context_lens_cpu=list(lengths),
        )


class AttentionBackend(ABC):
    """Computes causal attention of new tokens over their sequence's context.

    ``kv_cache`` is this layer's cache, shaped ``[2, num_blocks, block_size,
    num_kv_heads, head_dim]`` (keys then values), or None to attend only among
    the new tokens (no cache, e.g. a whole prompt in one pass).
    """

    @abstractmethod
    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        kv_cache: torch.Tensor | None,
        meta: AttentionMetadata,
        scale: float,
        sliding_window: int | None = None,
    ) -> torch.Tensor:
        """q: [T, H, D]; k, v: [T, Hkv, D] → [T, H, D]."""
