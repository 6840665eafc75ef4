"""Hidden states a thinker step hook keeps for a request: one row per computed position, each stored once.

Both omni families' thinkers hand hidden states to their talkers (Qwen3-Omni an intermediate layer's at the
prompt's media rows, Qwen2.5-Omni the last layer's at every row); what differs is which layer and when the rows
leave, not how they are kept. Positions recomputed after a preemption arrive again and are not stored twice.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class HiddenCapture:
    chunks: list[torch.Tensor] = field(default_factory=list)  # [k, H] kept rows, in position order
    num_captured: int = 0  # positions 0 .. num_captured - 1 have been recorded (some may have left by ``drain``)

    def record(self, start: int, rows: torch.Tensor) -> None:
        """Rows ``[k, H]`` of positions ``start .. start + k - 1``; a gap before ``start`` is a bug upstream."""
        if start > self.num_captured:
            raise RuntimeError(f"hidden states of positions {self.num_captured}..{start} were skipped")
        skip = self.num_captured - start  # positions recomputed after a preemption are already stored
        if skip < rows.shape[0]:
            self.chunks.append(rows[skip:].clone())
            self.num_captured = start + rows.shape[0]

    def all(self) -> torch.Tensor:
        """Every kept row ``[n, H]`` (all positions so far when nothing was drained)."""
        return torch.cat(self.chunks)

    def drain(self) -> torch.Tensor | None:
        """The rows kept since the previous drain (None: none), which are let go."""
        if not self.chunks:
            return None
        out = torch.cat(self.chunks) if len(self.chunks) > 1 else self.chunks[0]
        self.chunks = []
        return out
