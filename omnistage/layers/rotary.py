"""Rotary position embeddings: plain 1-D RoPE and Qwen3-Omni's interleaved M-RoPE.

M-RoPE gives every token three positions (temporal, height, width; all equal
for text). Each rotary frequency reads one of the three: with ``mrope_section
= [t, h, w]`` (summing to ``head_dim / 2``), frequency ``i`` uses height when
``i % 3 == 1 and i < 3h``, width when ``i % 3 == 2 and i < 3w``, temporal
otherwise. That is exactly what transformers'
``Qwen3OmniMoeThinkerTextRotaryEmbedding.recomposition_frequencies`` builds; here
the choice is a precomputed index, so one gather replaces the per-call
recomposition.

Angles are computed from the positions on each call (no cos/sin table): M-RoPE
positions of long videos can exceed any fixed table, and ``T x head_dim/2``
cos/sin values are cheap next to attention.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn


def rope_inv_freq(head_dim: int, theta: float) -> torch.Tensor:
    """``1 / theta^(2i/d)`` for ``i < d/2``, float32 (the reference's "default" rope)."""
    return 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))


def mrope_axis_index(mrope_section: Sequence[int], half_dim: int) -> torch.Tensor:
    """For each of the ``half_dim`` frequencies, which position row (0=t, 1=h, 2=w) it reads."""
    if sum(mrope_section) != half_dim or len(mrope_section) != 3:
        raise ValueError(f"mrope_section {list(mrope_section)} must have 3 parts summing to head_dim/2={half_dim}")
    axis = torch.zeros(half_dim, dtype=torch.long)
    for row in (1, 2):
        axis[row : mrope_section[row] * 3 : 3] = row
    return axis


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


@dataclass(frozen=True)
class Rotation:
    """One forward's rotary angles laid out for every layer: cos and a sign-folded sin, ``[T, 1, D]``.

    ``rotate_half(x) * sin`` equals ``x.roll(D/2) * signed_sin`` exactly (a sign moves from one factor to the
    other), so each rotation is a roll and three arithmetic ops instead of two slices, a negation and a cat:
    it runs for q and k in every layer of every step. The rotation runs in cos/sin's dtype (float32 from
    :class:`RotaryEmbedding`) and the result is cast back: with bf16 activations the angles of far positions keep
    their precision, as the peer keeps RoPE in float32 (for fp32 models this is the plain rotation).
    """

    cos: torch.Tensor
    signed_sin: torch.Tensor

    @classmethod
    def of(cls, cos: torch.Tensor, sin: torch.Tensor) -> Rotation:
        """From per-token cos/sin ``[T, D]`` (neox halves layout)."""
        half = sin.shape[-1] // 2
        return cls(cos[:, None, :], torch.cat((-sin[:, :half], sin[:, half:]), dim=-1)[:, None, :])

    def apply(self, x: torch.Tensor) -> torch.Tensor:
        """Rotates ``x [T, heads, D]``."""
        dtype = x.dtype
        x = x.to(self.cos.dtype)
        return (x * self.cos + x.roll(x.shape[-1] // 2, dims=-1) * self.signed_sin).to(dtype)


def apply_rotary(
    q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotates q ``[T, H, D]`` and k ``[T, Hkv, D]`` by per-token cos/sin ``[T, D]`` (neox halves layout)."""
    rotation = Rotation.of(cos, sin)
    return rotation.apply(q), rotation.apply(k)


class RotaryEmbedding(nn.Module):
    """cos/sin ``[T, head_dim]`` for positions ``[T]`` (1-D) or ``[3, T]`` (M-RoPE).

    With ``mrope_section=None`` this is plain RoPE and takes ``[T]`` positions.
    With a section it takes ``[3, T]``; a ``[T]`` tensor is accepted too and
    means a text-only batch (the same position on all three rows).
    """

    def __init__(self, head_dim: int, theta: float, mrope_section: Sequence[int] | None = None) -> None:
        super().__init__()
        if head_dim % 2:
            raise ValueError(f"rotary head_dim must be even, got {head_dim}")
        self.head_dim = head_dim
        self.register_buffer("inv_freq", rope_inv_freq(head_dim, theta), persistent=False)
        self.mrope = mrope_section is not None
        axis = mrope_axis_index(mrope_section, head_dim // 2) if self.mrope else torch.zeros(0, dtype=torch.long)
        self.register_buffer("axis", axis, persistent=False)

    def forward(self, positions: torch.Tensor, dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = self._positions_per_freq(positions).float() * self.inv_freq  # [T, D/2]
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(dtype), emb.sin().to(dtype)

    def _positions_per_freq(self, positions: torch.Tensor) -> torch.Tensor:
        """``[T, D/2]``: the position each frequency of each token rotates by."""
        if positions.dim() == 1:
            return positions[:, None]
        if not self.mrope:
            raise ValueError(f"1-D rotary takes positions [T], got shape {tuple(positions.shape)}")
        if positions.shape[0] != 3:
            raise ValueError(f"M-RoPE takes positions [3, T], got shape {tuple(positions.shape)}")
        return positions.index_select(0, self.axis).t()
