"""What the duplex engine needs of a full-duplex model (a family implements it; the engine names no family).

A duplex model keeps one row of state per live session, rows ``0..n-1``: :meth:`DuplexModel.open` appends a row
(prefilling the session's prompt), :meth:`DuplexModel.close` frees one by moving the last row into it, and
:meth:`DuplexModel.step` advances every live row by one frame: each row's user frame of codes in, its text token
and one agent frame of codes out.
"""

from __future__ import annotations

from collections.abc import Callable
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


class FrameCodec(Protocol):
    """A duplex model's streaming codec: user audio frames in, agent audio frames out, one stream per session row
    (rows kept like the model's: ``close`` moves the last row in), state carried between frames."""

    @property
    def samples_per_frame(self) -> int: ...

    def open(self) -> int: ...

    def close(self, row: int) -> int | None: ...

    def encode(self, audio: torch.Tensor) -> torch.Tensor:
        """Every live row's next user frame of samples [n, S] → codes [n, K]."""

    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        """Every live row's agent frame of codes [n, K] → samples [n, S]."""


SessionPrompt = Callable[[str | None, str | None], object | None]


@dataclass(frozen=True)
class DuplexServed:
    """What a duplex family's ``duplex`` hook gives the engine: its model and its codec (None: codes in and out).

    ``prompt``: a session's prompt (the family's type, for :meth:`DuplexModel.open`) from a live API's
    instructions and voice name; None where the checkpoint takes no prompt (a live session's instructions are then
    left unused). ``silent_text``: the text ids that stand for no text (padding), left out of transcripts."""

    model: DuplexModel
    codec: FrameCodec | None
    prompt: SessionPrompt | None = None
    silent_text: frozenset[int] = frozenset()
