"""One duplex session as its caller sees it: user frames in, agent frames out, and what went wrong counted.

Thread-safe at its two ends: a transport thread (or event loop) calls :meth:`DuplexSession.hear`, the engine's
tick thread takes one input frame a tick and delivers one :class:`AgentFrame` to ``on_frame``.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

LATENESS_KEPT = 45000  # an hour of 80 ms frames: the percentiles a bench reads


@dataclass(frozen=True)
class AgentFrame:
    """The agent's frame of one tick. ``late``: the step finished after the frame was due, so ``codes`` are
    silence; ``text``: the inner monologue's token of the tick (-1 when the frame is silence)."""

    index: int
    codes: torch.Tensor
    text: int
    late: bool
    lateness_s: float  # when it went out, from its tick's start
    audio: torch.Tensor | None = None  # the frame's samples where the engine runs the model's codec


@dataclass
class SessionStats:
    frames_out: int = 0
    late_frames: int = 0  # sent as silence: the step missed the frame's deadline
    filled_frames: int = 0  # input missing at its tick (network jitter): silence codes heard instead
    dropped_frames: int = 0  # input beyond the jitter buffer (a client ahead of real time): oldest dropped
    lateness_s: deque[float] = field(default_factory=lambda: deque(maxlen=LATENESS_KEPT))


class DuplexSession:
    def __init__(self, session_id: str, on_frame: Callable[[AgentFrame], None], jitter_frames: int = 8) -> None:
        self.id = session_id
        self.on_frame = on_frame
        self.stats = SessionStats()
        self.closed = False
        self._inputs: deque[torch.Tensor] = deque()
        self._jitter = jitter_frames
        self._lock = threading.Lock()

    def hear(self, frame: torch.Tensor) -> None:
        """One user frame as it arrives: samples [S] where the engine runs a codec, else codes [K]."""
        with self._lock:
            if len(self._inputs) >= self._jitter:
                self._inputs.popleft()
                self.stats.dropped_frames += 1
            self._inputs.append(frame)

    @property
    def queued(self) -> int:
        """User frames heard and not yet taken (a transport ahead of real time waits while this is full)."""
        with self._lock:
            return len(self._inputs)

    @property
    def room(self) -> int:
        """Frames the jitter buffer still takes before it drops the oldest."""
        return self._jitter - self.queued

    def take(self, silence: torch.Tensor) -> torch.Tensor:
        """The engine's tick: the oldest frame heard, or silence (counted) where none has arrived."""
        with self._lock:
            if self._inputs:
                return self._inputs.popleft()
        self.stats.filled_frames += 1
        return silence

    def deliver(self, frame: AgentFrame) -> None:
        self.stats.frames_out += 1
        self.stats.late_frames += frame.late
        self.stats.lateness_s.append(frame.lateness_s)
        self.on_frame(frame)


class AudioFramer:
    """A transport's audio (any chunk sizes) cut into the codec's frames: what a live API hands
    :meth:`DuplexSession.hear`, one frame per 80 ms of the user's audio."""

    def __init__(self, samples_per_frame: int) -> None:
        self.size = samples_per_frame
        self._held = torch.zeros(0)

    def frames(self, samples: torch.Tensor) -> list[torch.Tensor]:
        """Whole frames completed by ``samples`` (float, at the codec's rate); the rest is held for the next."""
        joined = torch.cat([self._held, samples.float().reshape(-1)])
        whole = len(joined) // self.size
        self._held = joined[whole * self.size:]
        return list(joined[:whole * self.size].view(whole, self.size)) if whole else []
