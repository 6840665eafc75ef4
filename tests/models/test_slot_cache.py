"""``SlotCache`` keeps every running sequence in a dense row: after joins, steps (past a doubling of the room and of
the rows) and leaves in any order, each row's keys/values are exactly what its sequence appended, and one masked
SDPA over the rows equals each sequence attending over its own cache alone."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from omnistage.models.sequence_cache import SequenceCache
from omnistage.models.slot_cache import KERNEL_ROWS, SlotCache

LAYERS, HEADS, KV_HEADS, DIM = 2, 4, 2, 8


def _prefilled(length: int, gen: torch.Generator) -> tuple[SequenceCache, list[list[torch.Tensor]]]:
    cache, appended = SequenceCache(), []
    for layer in range(LAYERS):
        k, v = torch.randn(2, 1, KV_HEADS, length, DIM, generator=gen)
        cache.extend(layer, k, v)
        appended.append([k, v])
    return cache, appended


def test_rows_hold_what_each_sequence_appended_and_attend_as_alone():
    gen = torch.Generator().manual_seed(0)
    slots, seqs = SlotCache(LAYERS), {}  # name -> (row, appended per layer)
    order: list[str] = []  # row order
    for step in range(300):
        if step in (0, 3, 5, 40):  # joins of unequal prompts: the rows grow past their first allocation
            name = f"s{step}"
            cache, appended = _prefilled(5 + 7 * len(seqs), gen)
            assert slots.join(cache) == len(order)
            seqs[name] = appended
            order.append(name)
        if step in (60, 200):  # leaves: the first row, then a middle one; the last row takes each place
            gone = order[0] if step == 60 else order[1]
            moved = slots.leave(order.index(gone))
            position = order.index(gone)
            last = order.pop()
            if last != gone:
                order[position] = last
            assert moved == (None if last == gone else len(order))
            del seqs[gone]
        step_ = slots.step()
        # KERNEL_ROWS rows or more attend in the kernel where it builds, fewer in SDPA: both paths are checked
        assert (step_.kernel is not None) == (slots.kernel is not None and len(order) >= KERNEL_ROWS)
        q = torch.randn(len(order), HEADS, 1, DIM, generator=gen)
        for layer in range(LAYERS):
            k, v = torch.randn(2, len(order), KV_HEADS, 1, DIM, generator=gen)
            keys, values = step_.extend(layer, k, v)
            batched = F.scaled_dot_product_attention(q, keys, values, attn_mask=step_.mask, enable_gqa=True)
            # the step's own attention: the paged decode kernel where it builds (writing k/v again is idempotent)
            attended = step_.attend(layer, q, k, v, DIM**-0.5)
            for row, name in enumerate(order):
                mine = seqs[name][layer]
                mine[0], mine[1] = torch.cat([mine[0], k[row:row + 1]], 2), torch.cat([mine[1], v[row:row + 1]], 2)
                alone = F.scaled_dot_product_attention(q[row:row + 1], mine[0], mine[1], enable_gqa=True)
                torch.testing.assert_close(batched[row:row + 1], alone, rtol=1e-5, atol=1e-6)
                torch.testing.assert_close(attended[row:row + 1], alone, rtol=1e-5, atol=1e-6)
        step_.done()
    for row, name in enumerate(order):
        length = seqs[name][0][0].shape[2]
        assert slots.lengths[row] == length
        for layer in range(LAYERS):
            assert torch.equal(slots.keys[layer][row, :, :length], seqs[name][layer][0][0])
            assert torch.equal(slots.values[layer][row, :, :length], seqs[name][layer][1][0])
