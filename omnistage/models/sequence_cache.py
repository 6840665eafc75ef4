"""``SequenceCache``: one sequence's keys and values per layer, contiguous, growing by what each step adds.

For the small-context generators that step every running utterance by one frame and attend each over its own
cache (Pocket TTS's backbone, Higgs Audio v2's generator): a few hundred positions per sequence, so one tensor
per layer costs less than any block table. Each layer's tensors live in a buffer with room to spare (doubled when
full), so a step writes its new position in place instead of copying the whole cache (``torch.cat`` of the
growing cache was the largest cost of a tiny generator's step); what a layer returns is a view of its filled part.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

_FIRST_ROOM = 64  # positions a layer's buffer holds beyond its first write


@dataclass
class SequenceCache:
    """One sequence's keys/values per layer: buffers ``[1, kv_heads, room, head_dim]``, the first ``length``
    positions filled. ``shared``: the buffers are another cache's too (:meth:`copy`), so the first write here
    moves them to buffers of this cache's own."""

    key_buffers: list[torch.Tensor] = field(default_factory=list)
    value_buffers: list[torch.Tensor] = field(default_factory=list)
    filled: list[int] = field(default_factory=list)
    shared: bool = False

    @property
    def length(self) -> int:
        return self.filled[0] if self.filled else 0

    def extend(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Appends ``[1, kv_heads, n, head_dim]`` to ``layer``; its keys and values so far (views)."""
        if layer == len(self.filled):
            self.key_buffers.append(self._room(k, k.shape[2] + _FIRST_ROOM))
            self.value_buffers.append(self._room(v, v.shape[2] + _FIRST_ROOM))
            self.filled.append(0)
        start, end = self.filled[layer], self.filled[layer] + k.shape[2]
        if self.shared:
            for i in range(len(self.filled)):
                self._move(i, self.key_buffers[i].shape[2])
            self.shared = False
        if end > self.key_buffers[layer].shape[2]:
            self._move(layer, max(end, 2 * self.key_buffers[layer].shape[2]))
        self.key_buffers[layer][:, :, start:end] = k
        self.value_buffers[layer][:, :, start:end] = v
        self.filled[layer] = end
        return self.key_buffers[layer][:, :, :end], self.value_buffers[layer][:, :, :end]

    def copy(self) -> SequenceCache:
        """A prefix's cache shared by many requests (a voice's): each extends its own copy."""
        self.shared = True  # this cache writing in place would change the copies' prefix too
        return SequenceCache(list(self.key_buffers), list(self.value_buffers), list(self.filled), shared=True)

    def _move(self, layer: int, room: int) -> None:
        """``layer``'s filled positions moved to buffers of this cache's own with ``room`` positions."""
        for buffers in (self.key_buffers, self.value_buffers):
            moved = self._room(buffers[layer], room)
            moved[:, :, :self.filled[layer]] = buffers[layer][:, :, :self.filled[layer]]
            buffers[layer] = moved

    @staticmethod
    def _room(like: torch.Tensor, positions: int) -> torch.Tensor:
        return like.new_empty(like.shape[0], like.shape[1], positions, like.shape[3])
