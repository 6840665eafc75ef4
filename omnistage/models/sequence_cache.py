"""``SequenceCache``: one sequence's keys and values per layer, contiguous, growing by what each step adds.

For the small-context generators that step every running utterance by one frame and attend each over its own
cache (Pocket TTS's backbone, Higgs Audio v2's generator): a few hundred positions per sequence, so one tensor
per layer costs less than any block table.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class SequenceCache:
    """One sequence's keys/values per layer, ``[1, kv_heads, T, head_dim]``."""

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
        """A prefix's cache shared by many requests (a voice's): each extends its own copy."""
        return SequenceCache(list(self.keys), list(self.values))
