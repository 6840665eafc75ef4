"""Talker frames in, codec chunk jobs out: how a stream of codec frames becomes vocoder work.

Shared by every family's codec edge (the streaming pipeline, run in the talker's replica) and its offline
generation: a chunk is cut once a frame past its end (and past its look-ahead) exists, so the final chunk is
always the one :meth:`FrameChunker.finish` emits, marked ``is_last``. Sizes come from a :class:`ChunkSizer`
(the orchestrator's player-aware orders) or a fixed :class:`ChunkPlan`; the left context and look-ahead from
the plan. Frames a talker emits under a delay pattern (codebook k ``delays[k]`` steps late) are aligned first,
so a codec stage always sees each frame whole.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from omnistage.engine.generation_engine import ChunkJob, StreamVoice


@dataclass(frozen=True)
class ChunkPlan:
    """How talker frames become codec chunks; defaults are transformers' ``chunked_decode(300, 25)``.

    A smaller ``first_chunk_frames`` starts audio sooner. ``seamless`` decodes each request as a stream
    (the vocoder keeps its state between chunks): no hole at each boundary, and the joined chunks equal one
    whole decode whatever the chunk sizes. ``lookahead``: frames after a chunk's new ones that its decode reads
    and drops (a decoder that is not causal); a chunk waits for them.
    """

    chunk_frames: int = 300
    left_context: int = 25
    first_chunk_frames: int | None = None
    seamless: bool = False
    lookahead: int = 0

    def __post_init__(self) -> None:
        if self.chunk_frames < 1 or self.left_context < 0 or self.lookahead < 0 or (
                self.first_chunk_frames is not None and self.first_chunk_frames < 1):
            raise ValueError(f"chunk sizes must be positive and contexts >= 0: {self}")

    def size(self, chunk_index: int, pending: int = 0) -> int:
        """Frames in chunk ``chunk_index`` (fixed: ``pending`` is for sizers that follow a player)."""
        first = self.first_chunk_frames or self.chunk_frames
        return first if chunk_index == 0 else self.chunk_frames


class ChunkSizer(Protocol):
    """Frames the chunk ``chunk_index`` takes, asked each time frames arrive (``pending`` are waiting); None: not
    known yet (the chunk waits for its size)."""

    def size(self, chunk_index: int, pending: int) -> int | None: ...


class Undelay:
    """Rows ``[n, W]`` emitted under a delay pattern in, aligned frames out: frame ``t``'s codebook ``k`` is row
    ``t + delays[k]``'s. A frame is out once every codebook reached it; the staircase's unfinished tail never is
    (the reference drops it too)."""

    def __init__(self, delays: tuple[int, ...]) -> None:
        self.delays = delays
        # Every codebook's row offset and column: a step's frames come out in one gather (a talker step makes
        # one row per stream, so the per-frame cost is the number of tensor calls, not their size).
        self._offsets = torch.tensor(delays, dtype=torch.long)
        self._columns = torch.arange(len(delays))
        self._rows: torch.Tensor | None = None  # rows not yet fully used, from row ``_base`` on
        self._base = 0  # stream row index of ``_rows[0]``
        self._done = 0  # aligned frames given out

    def push(self, rows: torch.Tensor) -> torch.Tensor:
        self._rows = rows if self._rows is None else torch.cat([self._rows, rows])
        ready = self._base + self._rows.shape[0] - max(self.delays)  # frames every codebook reached
        if ready <= self._done:
            return rows[:0]
        t = torch.arange(self._done - self._base, ready - self._base)
        out = self._rows[t[:, None] + self._offsets, self._columns]
        keep = ready + min(self.delays) - self._base  # rows a later frame still reads start here
        self._rows, self._base, self._done = self._rows[keep:], self._base + keep, ready
        return out


class FrameChunker:
    """Frames ``[n, W]`` in (any pace), chunk jobs out. ``prime`` ``[W, R]``: frames the stream's first chunk
    decodes before the new ones without returning their audio (a cloned voice's reference frames). ``voice``: what
    the stream's decoder is conditioned on, sent with its first chunk."""

    def __init__(self, request_id: str, plan: ChunkPlan, width: int, sizer: ChunkSizer | None = None,
                 prime: torch.Tensor | None = None, delays: tuple[int, ...] = (),
                 dtype: torch.dtype = torch.long, voice: StreamVoice | None = None) -> None:
        self.request_id, self.plan, self.voice = request_id, plan, voice
        self.sizer: ChunkSizer = sizer or plan
        self._undelay = Undelay(delays) if any(delays) else None
        self._prime = 0 if prime is None else prime.shape[1]
        self._buf = torch.empty(width, 0, dtype=dtype) if prime is None else prime.to("cpu", dtype)
        self._dtype = dtype
        self._context = 0
        self._index = 0

    @property
    def num_pending(self) -> int:
        """New frames not yet in a chunk (look-ahead frames already read by one included)."""
        return self._buf.shape[1] - self._context - self._prime

    @property
    def next_index(self) -> int:
        return self._index

    def push(self, frames: torch.Tensor) -> list[ChunkJob]:
        frames = frames.to("cpu", self._dtype)
        if self._undelay is not None:
            frames = self._undelay.push(frames)
        self._buf = torch.cat([self._buf, frames.T], dim=1)
        return self.cut()

    def cut(self) -> list[ChunkJob]:
        """Every chunk the sizer's current sizes allow (also after a size changed with no new frame)."""
        jobs = []
        while (size := self.sizer.size(self._index, self.num_pending)) is not None \
                and self.num_pending > size + self.plan.lookahead:
            jobs.append(self._emit(size, last=False))
        return jobs

    def finish(self) -> list[ChunkJob]:
        return [self._emit(self.num_pending, last=True)] if self.num_pending else []

    def _emit(self, num_new: int, last: bool) -> ChunkJob:
        end = self._context + self._prime + num_new
        ahead = 0 if last else self.plan.lookahead
        job = ChunkJob(self.request_id, self._index, self._buf[:, :end + ahead].clone(), self._context,
                       is_last=last, discard_frames=self._prime, lookahead=ahead,
                       voice=self.voice if self._index == 0 else None)
        keep = min(self.plan.left_context, end)
        self._buf, self._context, self._prime = self._buf[:, end - keep:], keep, 0
        self._index += 1
        return job
