"""``SlotCache``: every running sequence's keys and values in one padded tensor per layer, a row a sequence.

For the small-context generators that step every running utterance by one position (Higgs Audio v2's generator):
with a :class:`SequenceCache` per sequence a decode step writes and attends sequence by sequence, ~6 tensor calls
per sequence and layer, and at tiny widths those calls are the step. Here the running sequences hold rows
``0..n-1`` (kept dense: a leaving row takes the last one's place), so a step writes every row's new position in one
indexed store and attends in one SDPA over the rows' filled prefix, the shorter rows' padding masked
(:class:`SlotStep`). A prompt is prefilled in its own ``SequenceCache`` and copied into a row when it joins.
"""

from __future__ import annotations

import torch

from omnistage.models.sequence_cache import SequenceCache

_FIRST_ROOM = 256  # positions a row holds before the buffers double


class SlotCache:
    def __init__(self, layers: int) -> None:
        self.layers = layers
        self.keys: list[torch.Tensor] = []  # per layer [rows, kv_heads, room, head_dim]
        self.values: list[torch.Tensor] = []
        self.lengths: list[int] = []  # filled positions of each occupied row

    @property
    def count(self) -> int:
        return len(self.lengths)

    def join(self, cache: SequenceCache) -> int:
        """A prefilled sequence's keys and values copied into the next free row; its row."""
        length, row = cache.length, self.count
        self._fit(row + 1, length + 1, cache.key_buffers[0])
        for layer in range(self.layers):
            self.keys[layer][row, :, :length] = cache.key_buffers[layer][0, :, :length]
            self.values[layer][row, :, :length] = cache.value_buffers[layer][0, :, :length]
        self.lengths.append(length)
        return row

    def leave(self, row: int) -> int | None:
        """Frees ``row``: the last row moves into it. Which row moved (None: ``row`` was the last)."""
        last = self.count - 1
        if row != last:
            length = self.lengths[last]
            for buffers in (self.keys, self.values):
                for layer in range(self.layers):
                    buffers[layer][row, :, :length] = buffers[layer][last, :, :length]
            self.lengths[row] = length
        self.lengths.pop()
        return last if row != last else None

    def step(self) -> SlotStep:
        """Every occupied row's next position, rows in order."""
        self._fit(self.count, max(self.lengths) + 1, self.keys[0])
        return SlotStep(self, list(self.lengths))

    def _fit(self, rows: int, positions: int, like: torch.Tensor) -> None:
        """Buffers holding at least ``rows`` rows and ``positions`` positions (doubled when grown)."""
        have_rows, room = (self.keys[0].shape[0], self.keys[0].shape[2]) if self.keys else (0, 0)
        if rows <= have_rows and positions <= room:
            return
        new_rows = have_rows if rows <= have_rows else max(rows, 2 * have_rows)
        new_room = room if positions <= room else max(positions + _FIRST_ROOM, 2 * room)
        for buffers in (self.keys, self.values):
            for layer in range(self.layers):
                # zeros: a row's padding is masked, but a weight of 0 times an uninitialised NaN is still NaN
                grown = like.new_zeros(new_rows, like.shape[1], new_room, like.shape[3])
                if layer < len(buffers):
                    grown[:have_rows, :, :room] = buffers[layer]
                    buffers[layer] = grown
                else:
                    buffers.append(grown)


class SlotStep:
    """One decode step over rows ``0..n-1``: each writes its position ``lengths[i]``, then attends over its
    ``lengths[i] + 1`` positions (one additive mask for every layer; none when every row is as long)."""

    def __init__(self, cache: SlotCache, lengths: list[int]) -> None:
        self.cache, self.lengths = cache, lengths
        device = cache.keys[0].device
        self.positions = torch.tensor(lengths, device=device)
        self.rows = torch.arange(len(lengths), device=device)
        self.width = max(lengths) + 1
        # Additive (0 / -inf in the cache's dtype), made once a step: SDPA turns a boolean mask into this very
        # tensor (where(~mask, -inf, 0)) on every call, three ops a layer.
        self.mask = None if min(lengths) == max(lengths) else torch.zeros(
            len(lengths), 1, 1, self.width, dtype=cache.keys[0].dtype, device=device).masked_fill_(
            torch.arange(self.width, device=device) > self.positions[:, None, None, None], float("-inf"))

    def extend(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``[n, kv_heads, 1, head_dim]`` written at each row's position; the rows' keys and values (views)."""
        keys, values = self.cache.keys[layer], self.cache.values[layer]
        keys[self.rows, :, self.positions] = k[:, :, 0]
        values[self.rows, :, self.positions] = v[:, :, 0]
        n = len(self.lengths)
        return keys[:n, :, :self.width], values[:n, :, :self.width]

    def done(self) -> None:
        """Every row holds one position more (after the step's last layer)."""
        self.cache.lengths[:] = [length + 1 for length in self.lengths]
