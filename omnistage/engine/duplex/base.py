"""What the duplex engine needs of a full-duplex model (a family implements it; the engine names no family).

A duplex model keeps one row of state per live session, rows ``0..n-1``: :meth:`DuplexModel.open` appends a row
(prefilling the session's prompt), :meth:`DuplexModel.close` frees one by moving the last row into it, and
:meth:`DuplexModel.step` advances every live row by one frame: each row's user frame of codes in, its text token
and one agent frame of codes out.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch


@dataclass(frozen=True)
class DuplexStep:
    """One step's rows: ``text`` [n] tokens, ``frames`` [n, K] agent codes, ``complete`` [n] (False: the row has
    no generated frame yet this step, e.g. its first step; the engine sends silence)."""

    text: torch.Tensor
    frames: torch.Tensor
    complete: torch.Tensor


class DuplexModel(Protocol):
    @property
    def frame_s(self) -> float:
        """Seconds of audio one frame stands for (the tick period)."""

    @property
    def max_rows(self) -> int:
        """Sessions the model has state for."""

    @property
    def rows(self) -> int:
        """Live sessions."""

    def silence(self) -> torch.Tensor:
        """A silent frame's codes [K]: the user's input where a frame is missing, the agent's where one is late."""

    def open(self, prompt: object | None) -> int:
        """A new session's row (its prompt, a family type, prefilled)."""

    def close(self, row: int) -> int | None:
        """Frees ``row``; returns the row whose session moved into it (None: it was the last)."""

    def step(self, user: torch.Tensor) -> DuplexStep:
        """Every live row one frame on: ``user`` [n, K]."""
