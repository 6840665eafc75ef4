"""A bounded KV cache per session: each layer keeps a session's last ``window`` positions in a ring.

Moshi's temporal transformer attends over a sliding window (3000 frames, four minutes), so a session's KV never
grows past it: position ``p`` lives in slot ``p % window``, and a query at ``q`` sees the keys at positions
``q - window < p <= q``. Slots are session rows; the duplex engine keeps live sessions in rows ``0..n-1`` so a
tick's batch reads the cache as a view (no gather).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


class RingCache:
    """Keys and values of ``rows`` sessions, ``layers`` layers, ``window`` positions each."""

    def __init__(self, rows: int, layers: int, kv_heads: int, head_dim: int, window: int,
                 dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu") -> None:
        shape = (layers, rows, kv_heads, window, head_dim)
        self.keys = torch.zeros(shape, dtype=dtype, device=device)
        self.values = torch.zeros(shape, dtype=dtype, device=device)
        self.positions = torch.full((rows, window), -1, dtype=torch.long, device=device)  # -1: empty slot
        self.window = window

    @property
    def rows(self) -> int:
        return self.positions.shape[0]

    def clear(self, row: int) -> None:
        self.positions[row] = -1

    def move(self, src: int, dst: int) -> None:
        """Row ``src``'s session now lives in row ``dst`` (the engine keeps live rows contiguous)."""
        self.keys[:, dst] = self.keys[:, src]
        self.values[:, dst] = self.values[:, src]
        self.positions[dst] = self.positions[src]
        self.positions[src] = -1

    def span(self, pos: torch.Tensor) -> int:
        """Slots a step at ``pos`` [B] reads: until a ring has wrapped its positions fill slots ``0..pos`` only,
        so young sessions do not pay for the whole window."""
        return min(self.window, int(pos.max()) + 1)

    def step(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, pos: torch.Tensor,
             last_layer: bool, span: int) -> torch.Tensor:
        """One new position for rows ``0..B-1`` (``q`` [B, H, 1, D], ``k``/``v`` [B, KV, 1, D], ``pos`` [B]),
        attending over slots ``0..span-1`` (:meth:`span`).

        The new key overwrites the slot of the position that just left the window, so writing first and
        attending over the ring is exact; the positions row is advanced after the last layer."""
        n = q.shape[0]
        slots = pos % self.window
        rows = torch.arange(n, device=q.device)
        self.keys[layer, rows, :, slots] = k[:, :, 0]
        self.values[layer, rows, :, slots] = v[:, :, 0]
        kpos = self.positions[:n, :span].clone()
        kpos[rows, slots] = pos
        mask = _window_mask(pos[:, None], kpos, self.window)[:, None, None]  # [B, 1, 1, span]
        out = _attend(q, self.keys[layer, :n, :, :span], self.values[layer, :n, :, :span], mask)
        if last_layer:
            self.positions[rows, slots] = pos
        return out

    def prefill(self, layer: int, row: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, start: int,
                last_layer: bool) -> torch.Tensor:
        """``T`` new positions ``start..start+T-1`` of one session (``q`` [1, H, T, D]): the chunk attends to the
        ring's keys and its own (causal, windowed), then its last ``window`` positions are written."""
        t = q.shape[2]
        qpos = torch.arange(start, start + t, device=q.device)
        keys = torch.cat([self.keys[layer, row:row + 1], k], dim=2)
        values = torch.cat([self.values[layer, row:row + 1], v], dim=2)
        kpos = torch.cat([self.positions[row], qpos])
        out = _attend(q, keys, values, _window_mask(qpos[:, None], kpos[None], self.window)[None, None])
        keep = min(t, self.window)
        slots = qpos[-keep:] % self.window
        self.keys[layer, row, :, slots] = k[0, :, -keep:]
        self.values[layer, row, :, slots] = v[0, :, -keep:]
        if last_layer:
            self.positions[row, slots] = qpos[-keep:]
        return out


def _window_mask(qpos: torch.Tensor, kpos: torch.Tensor, window: int) -> torch.Tensor:
    return (kpos >= 0) & (kpos <= qpos) & (kpos > qpos - window)


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    if k.shape[1] != q.shape[1]:  # grouped-query attention: each KV head serves a group of query heads
        k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
        v = v.repeat_interleave(q.shape[1] // v.shape[1], dim=1)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
