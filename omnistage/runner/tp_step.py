"""What rank 0 of a tensor-parallel decoder sends the other ranks, one message per call.

A call is three broadcasts: a fixed header (what follows and how large) and the integers (positions, the
attention layout, deepstack rows) on the CPU group, then the floats (input embeddings, deepstack features) on the
device group. Rank 0 embeds, encodes media and samples alone; the other ranks only run the decoder's layers on
what they receive, with their own shards and KV caches.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum

import torch

from omnistage.layers.attention.base import AttentionMetadata
from omnistage.runner.tp_group import TPGroup


class Op(IntEnum):
    FORWARD = 1
    ALLOC_KV = 2  # args: blocks, block size; the others allocate KV caches of that many blocks
    STOP = 3


# FORWARD: op, tokens, hidden, position rows, sequences, block-table width (-1: none), has cache, deepstack rows,
# deepstack layers, unused. Other ops: op, then their arguments.
HEADER_LEN = 10


@dataclass
class DecoderCall:
    """One forward of the decoder's layers, as every rank runs it."""

    inputs_embeds: torch.Tensor  # [T, H]
    positions: torch.Tensor  # [T] or [3, T]
    meta: AttentionMetadata
    has_cache: bool  # False: attend among the new tokens only (no KV cache, e.g. a profile or a whole prompt)
    deepstack_rows: torch.Tensor | None = None  # [V]
    deepstack_features: torch.Tensor | None = None  # [L, V, H]


def send_op(group: TPGroup, op: Op, *args: int) -> None:
    header = torch.zeros(HEADER_LEN, dtype=torch.int64)
    header[0] = int(op)
    header[1:1 + len(args)] = torch.tensor(args, dtype=torch.int64)
    group.broadcast_cpu(header)


def send_call(group: TPGroup, call: DecoderCall) -> None:
    meta, embeds = call.meta, call.inputs_embeds
    tokens, hidden = embeds.shape
    positions = call.positions.reshape(-1, tokens)
    tables = meta.block_tables if call.has_cache else None
    width = -1 if tables is None else tables.shape[1]
    rows, features = call.deepstack_rows, call.deepstack_features
    ds_rows, ds_layers = (0, 0) if rows is None else (rows.numel(), features.shape[0])
    header = torch.tensor([Op.FORWARD, tokens, hidden, positions.shape[0], meta.num_seqs, width,
                           int(call.has_cache), ds_rows, ds_layers, 0], dtype=torch.int64)
    ints = [positions.flatten(), meta.query_start_loc, meta.context_lens, meta.slot_mapping]
    ints += [tables.flatten()] if tables is not None else []
    ints += [rows] if rows is not None else []
    group.broadcast_cpu(header)
    group.broadcast_cpu(torch.cat([t.to("cpu", torch.int64) for t in ints]))
    floats = [embeds.flatten()] + ([features.to(embeds.dtype).flatten()] if features is not None else [])
    group.broadcast_device(torch.cat(floats) if len(floats) > 1 else floats[0].contiguous())


def recv_header(group: TPGroup) -> torch.Tensor:
    header = torch.empty(HEADER_LEN, dtype=torch.int64)
    group.broadcast_cpu(header)
    return header


def recv_call(group: TPGroup, header: torch.Tensor, dtype: torch.dtype) -> DecoderCall:
    """The rest of a FORWARD whose ``header`` arrived; tensors on the group's device."""
    _, tokens, hidden, pos_rows, seqs, width, has_cache, ds_rows, ds_layers, _ = header.tolist()
    sizes = [pos_rows * tokens, seqs + 1, seqs, tokens, max(width, 0) * seqs, ds_rows]
    ints = torch.empty(sum(sizes), dtype=torch.int64)
    group.broadcast_cpu(ints)
    positions, starts, lens, slots, tables, rows = ints.split(sizes)
    floats = torch.empty(tokens * hidden + ds_layers * ds_rows * hidden, dtype=dtype, device=group.device)
    group.broadcast_device(floats)
    embeds, features = floats.split([tokens * hidden, ds_layers * ds_rows * hidden])
    device = group.device
    starts_list = starts.tolist()
    meta = AttentionMetadata(
        query_start_loc=starts.to(device, torch.int32), context_lens=lens.to(device, torch.int32),
        slot_mapping=slots.to(device), block_tables=tables.view(seqs, width).to(device, torch.int32)
        if width >= 0 else None,
        query_lens=[b - a for a, b in zip(starts_list, starts_list[1:])], context_lens_cpu=lens.tolist(),
    )
    positions = positions.view(pos_rows, tokens).to(device)
    return DecoderCall(embeds.view(tokens, hidden), positions[0] if pos_rows == 1 else positions, meta,
                       bool(has_cache), rows.to(device) if ds_rows else None,
                       features.view(ds_layers, ds_rows, hidden) if ds_rows else None)
