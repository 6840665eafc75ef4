"""Talker frames in, codec chunk jobs out: how a stream of codec frames becomes vocoder work.

Shared by every family's codec edge (the streaming pipeline) and its offline
generation: a chunk is cut once a frame past its end exists, so the final chunk
is always the one :meth:`FrameChunker.finish` emits, marked ``is_last``. Sizes
come from a :class:`ChunkSizer` (a player-aware planner) or a fixed
:class:`ChunkPlan`; the left context from the plan.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from omnistage.engine.generation_engine import ChunkJob


@dataclass(frozen=True)
class ChunkPlan:
    """How talker frames become codec chunks; defaults are transformers' ``chunked_decode(300, 25)``.

    A smaller ``first_chunk_frames`` starts audio sooner. ``seamless`` decodes each request as a stream
    (the vocoder keeps its state between chunks): no hole at each boundary, and the joined chunks equal one
    whole decode whatever the chunk sizes.
    """

    chunk_frames: int = 300
    left_context: int = 25
    first_chunk_frames: int | None = None
    seamless: bool = False

    def __post_init__(self) -> None:
        if self.chunk_frames < 1 or self.left_context < 0 or (self.first_chunk_frames is not None
                                                               and self.first_chunk_frames < 1):
            raise ValueError(f"chunk sizes must be positive and left_context >= 0: {self}")

    def size(self, chunk_index: int, pending: int = 0) -> int:
        """Frames in chunk ``chunk_index`` (fixed: ``pending`` is for sizers that follow a player)."""
        first = self.first_chunk_frames or self.chunk_frames
        return first if chunk_index == 0 else self.chunk_frames


class ChunkSizer(Protocol):
    """Frames the chunk ``chunk_index`` takes, asked each time frames arrive (``pending`` are waiting)."""

    def size(self, chunk_index: int, pending: int) -> int: ...


class FrameChunker:
    """Frames ``[n, G]`` in (any pace), chunk jobs out. ``prime`` ``[G, R]``: frames the stream's first chunk
    decodes before the new ones without returning their audio (a cloned voice's reference frames)."""

    def __init__(self, request_id: str, plan: ChunkPlan, num_groups: int, sizer: ChunkSizer | None = None,
                 prime: torch.Tensor | None = None) -> None:
        self.request_id, self.plan = request_id, plan
        self.sizer: ChunkSizer = sizer or plan
        self._prime = 0 if prime is None else prime.shape[1]
        self._buf = torch.empty(num_groups, 0, dtype=torch.long) if prime is None else prime.to("cpu", torch.long)
        self._context = 0
        self._index = 0

    @property
    def num_pending(self) -> int:
        return self._buf.shape[1] - self._context - self._prime

    def push(self, frames: torch.Tensor) -> list[ChunkJob]:
        self._buf = torch.cat([self._buf, frames.to("cpu", torch.long).T], dim=1)
        jobs = []
        while self.num_pending > (size := self.sizer.size(self._index, self.num_pending)):
            jobs.append(self._emit(size, last=False))
        return jobs

    def finish(self) -> list[ChunkJob]:
        return [self._emit(self.num_pending, last=True)] if self.num_pending else []

    def _emit(self, num_new: int, last: bool) -> ChunkJob:
        end = self._context + self._prime + num_new
        job = ChunkJob(self.request_id, self._index, self._buf[:, :end].clone(), self._context, is_last=last,
                       discard_frames=self._prime)
        keep = min(self.plan.left_context, end)
        self._buf, self._context, self._prime = self._buf[:, end - keep:], keep, 0
        self._index += 1
        return job
