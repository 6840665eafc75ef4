"""Where two greedy runs first part, and whether the reference's choice there was a near-tie.

At the first step where omnistage's id and the reference's differ, the reference's scores (what its greedy argmax
saw, after its logits processors) give two numbers: its top-2 gap, and how far it preferred its own pick to ours.
A gap of float-noise size (a few 1e-7 relative to the logits) is a tie that any other order of computation may
flip; a gap far above it means the two runs computed different things. Shared by the families' verify reports.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Divergence:
    step: int
    ours: int | None  # None: that run stopped before this step
    theirs: int | None
    top2_gap: float | None  # the reference's best minus second-best score at ``step`` (None: no scores)
    margin: float | None  # the reference's score of its pick minus its score of ours (inf: ours masked there)

    def describe(self) -> str:
        head = f"first differs at step {self.step}: omnistage {_id(self.ours)}, reference {_id(self.theirs)}"
        if self.top2_gap is None:
            return head
        margin = "" if self.margin is None else f", its margin over omnistage's pick {self.margin:.3g}"
        return f"{head}; reference's top-2 gap {self.top2_gap:.3g}{margin}"


def first_divergence(ours: Sequence[int], theirs: Sequence[int],
                     scores: Sequence[torch.Tensor] = ()) -> Divergence | None:
    """None when the runs are identical; ``scores``: the reference's ``[V]`` scores per step (may be empty)."""
    ours, theirs = list(ours), list(theirs)
    step = next((i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b), min(len(ours), len(theirs)))
    if step == len(ours) == len(theirs):
        return None
    mine = ours[step] if step < len(ours) else None
    their = theirs[step] if step < len(theirs) else None
    if step >= len(scores):
        return Divergence(step, mine, their, None, None)
    row = scores[step].float()
    best = row.topk(2).values
    margin = None if mine is None or their is None else float(row[their] - row[mine])
    return Divergence(step, mine, their, float(best[0] - best[1]), margin)


def _id(token: int | None) -> str:
    return "stopped" if token is None else str(token)
