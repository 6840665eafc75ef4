"""``SlotCache``: every running sequence's keys and values in one padded tensor per layer, a row a sequence.

For the small-context generators that step every running utterance by one position (Higgs Audio v2's generator):
with a :class:`SequenceCache` per sequence a decode step writes and attends sequence by sequence, ~6 tensor calls
per sequence and layer, and at tiny widths those calls are the step. Here the running sequences hold rows
``0..n-1`` (kept dense: a leaving row takes the last one's place), so a step writes every row's new position in one
indexed store and attends in one SDPA over the rows' filled prefix, the shorter rows' padding masked
(:class:`SlotStep`). A prompt is prefilled in its own ``SequenceCache`` and copied into a row when it joins.
A layer's rows are laid out as the paged cache ``[2, rows, room, kv_heads, head_dim]`` with one block a row, so a
step attends in the CPU paged decode kernel (:mod:`omnistage.layers.attention.native`: ~10 us against SDPA's ~22
for 8 rows of ~100 positions), or in SDPA over the same rows as views where the kernel cannot be built.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from omnistage.layers.attention import native
from omnistage.models.sequence_cache import SequenceCache

_FIRST_ROOM = 256  # positions a row holds before the buffers double
# Fewer rows attend in SDPA: the kernel's fixed cost (a ctypes call of 19 arguments, q scaled, its scratch) is more
# than SDPA's for one unmasked row (a tiny step, one process alternately: batch 1 +8% on the kernel, 2 equal, 3
# -2%, 8 -5..-9%).
KERNEL_ROWS = 3


class SlotCache:
    def __init__(self, layers: int) -> None:
        self.layers = layers
        self.kv: list[torch.Tensor] = []  # per layer [2, rows, room, kv_heads, head_dim]
        self.lengths: list[int] = []  # filled positions of each occupied row
        self.kernel = native.load()  # None: attention on SDPA

    @property
    def keys(self) -> list[torch.Tensor]:
        """Per layer ``[rows, kv_heads, room, head_dim]``, views."""
        return [kv[0].transpose(1, 2) for kv in self.kv]

    @property
    def values(self) -> list[torch.Tensor]:
        return [kv[1].transpose(1, 2) for kv in self.kv]

    @property
    def count(self) -> int:
        return len(self.lengths)

    def join(self, cache: SequenceCache) -> int:
        """A prefilled sequence's keys and values copied into the next free row; its row."""
        length, row = cache.length, self.count
        self._fit(row + 1, length + 1, cache.key_buffers[0])
        for layer in range(self.layers):
            self.kv[layer][0, row, :length] = cache.key_buffers[layer][0, :, :length].transpose(0, 1)
            self.kv[layer][1, row, :length] = cache.value_buffers[layer][0, :, :length].transpose(0, 1)
        self.lengths.append(length)
        return row

    def leave(self, row: int) -> int | None:
        """Frees ``row``: the last row moves into it. Which row moved (None: ``row`` was the last)."""
        last = self.count - 1
        if row != last:
            length = self.lengths[last]
            for kv in self.kv:
                kv[:, row, :length] = kv[:, last, :length]
            self.lengths[row] = length
        self.lengths.pop()
        return last if row != last else None

    def step(self) -> SlotStep:
        """Every occupied row's next position, rows in order."""
        self._fit(self.count, max(self.lengths) + 1, self.kv[0])
        return SlotStep(self, list(self.lengths))

    def _fit(self, rows: int, positions: int, like: torch.Tensor) -> None:
        """Buffers holding at least ``rows`` rows and ``positions`` positions (doubled when grown). ``like``: a
        sequence's ``[1, kv_heads, T, head_dim]`` or a layer's buffer."""
        have_rows, room = (self.kv[0].shape[1], self.kv[0].shape[2]) if self.kv else (0, 0)
        if rows <= have_rows and positions <= room:
            return
        new_rows = have_rows if rows <= have_rows else max(rows, 2 * have_rows)
        new_room = room if positions <= room else max(positions + _FIRST_ROOM, 2 * room)
        kv_heads, head_dim = (like.shape[3], like.shape[4]) if like.dim() == 5 else (like.shape[1], like.shape[3])
        for layer in range(self.layers):
            # zeros: a row's padding is masked, but a weight of 0 times an uninitialised NaN is still NaN
            grown = like.new_zeros(2, new_rows, new_room, kv_heads, head_dim)
            if layer < len(self.kv):
                grown[:, :have_rows, :room] = self.kv[layer]
                self.kv[layer] = grown
            else:
                self.kv.append(grown)


class SlotStep:
    """One decode step over rows ``0..n-1``: each writes its position ``lengths[i]``, then attends over its
    ``lengths[i] + 1`` positions."""

    def __init__(self, cache: SlotCache, lengths: list[int]) -> None:
        self.cache, self.lengths = cache, lengths
        like = cache.kv[0]
        device = like.device
        self.positions = torch.tensor(lengths, device=device)
        self.rows = torch.arange(len(lengths), device=device)
        self.width = max(lengths) + 1
        kernel = (cache.kernel is not None and like.is_cpu and like.dtype in native.CACHE_KINDS
                  and len(lengths) >= KERNEL_ROWS)
        self.kernel = cache.kernel if kernel else None
        if self.kernel is not None:  # one block a row: row i is block i, its context lengths[i] + 1
            self.tables = self.rows.to(torch.int32)[:, None]
            self.context = (self.positions + 1).to(torch.int32)

    @functools.cached_property
    def mask(self) -> torch.Tensor | None:
        """SDPA's padding mask, additive (0 / -inf in the cache's dtype), made once a step: SDPA turns a boolean
        one into this very tensor on every call (three ops a layer). None when every row is as long."""
        if min(self.lengths) == max(self.lengths):
            return None
        like = self.cache.kv[0]
        return torch.zeros(len(self.lengths), 1, 1, self.width, dtype=like.dtype, device=like.device).masked_fill_(
            torch.arange(self.width, device=like.device) > self.positions[:, None, None, None], float("-inf"))

    def extend(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``[n, kv_heads, 1, head_dim]`` written at each row's position; the rows' keys and values (views)."""
        kv = self.cache.kv[layer]
        kv[0, self.rows, self.positions] = k[:, :, 0]
        kv[1, self.rows, self.positions] = v[:, :, 0]
        n = len(self.lengths)
        return kv[0, :n, :self.width].transpose(1, 2), kv[1, :n, :self.width].transpose(1, 2)

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
        """``q [n, heads, 1, D]`` over each row's positions once ``k``/``v`` are written -> ``[n, heads, 1, D]``."""
        keys, values = self.extend(layer, k, v)
        if self.kernel is None or q.dtype != torch.float32:
            return F.scaled_dot_product_attention(q, keys, values, attn_mask=self.mask, scale=scale, enable_gqa=True)
        n, heads, _, head_dim = q.shape
        kv_heads = keys.shape[1]
        grouped = (n, kv_heads, heads // kv_heads, head_dim)
        out = torch.empty(grouped, dtype=q.dtype, device=q.device)
        native.paged_decode(self.kernel, (q * scale).reshape(grouped), self.cache.kv[layer], self.tables,
                            self.context, self.tables[:, 0], self.tables[:, 0], None, self.width, out)
        return out.view(n, heads, 1, head_dim)

    def done(self) -> None:
        """Every row holds one position more (after the step's last layer)."""
        self.cache.lengths[:] = [length + 1 for length in self.lengths]
