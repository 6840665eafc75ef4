"""One sequence's keys/values per layer in contiguous tensors, for the small backbones that step each utterance on
its own cache (Pocket TTS's, CSM's): a few hundred positions, so a cat per step costs less than paging."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class SequenceCache:
    """Keys/values per layer, ``[B, kv_heads, T, head_dim]`` (``B`` 1, or sequences moving in lockstep)."""

    keys: list[torch.Tensor] = field(default_factory=list)
    values: list[torch.Tensor] = field(default_factory=list)

    @property
    def length(self) -> int:
        return self.keys[0].shape[2] if self.keys else 0

    def extend(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if layer == len(self.keys):
            self.keys.append(k)
            self.values.append(v)
        else:
            self.keys[layer] = torch.cat([self.keys[layer], k], dim=2)
            self.values[layer] = torch.cat([self.values[layer], v], dim=2)
        return self.keys[layer], self.values[layer]

    def copy(self) -> SequenceCache:
        """A shared prefix's cache (a voice's): each request extends its own copy."""
        return SequenceCache(list(self.keys), list(self.values))
