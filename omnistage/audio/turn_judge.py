"""``semantic_vad``'s judge of one stream: at each pause its detector reports, Smart Turn says whether the turn is over.

The detector (Silero or the energy one) hands over each frame of audio it scores;
the judge keeps what a question can need (the last 8 s and the 500 ms before a turn's
speech start, at the detector's rate) and, asked about frames ``[start, end)``, runs
the classifier (``smart_turn.py``) on that stretch from 500 ms before ``start``. It
runs where the detector runs: in the realtime VAD pool, off the event loop.
"""

from __future__ import annotations

import logging

import numpy as np

from omnistage.audio.decode import resample
from omnistage.audio.smart_turn import PRE_SPEECH_MS, RATE, THRESHOLD, WINDOW_S, SmartTurn

logger = logging.getLogger(__name__)

# semantic_vad: the silence after which the Smart Turn classifier is first asked whether the turn is over (asked
# again as the silence doubles: vad.py), and each eagerness's longest wait when it says "incomplete" (OpenAI's: low
# ~8 s, medium ~4 s, high ~2 s; auto is medium). pipecat waits 200 ms (its VAD's stop_secs) before asking; asking
# first at 100 ms (128 ms in Silero's 32 ms windows) cuts the reply's start by that much where the verdict is
# already "complete", and a later ask catches the rest. A speculative reply starts sooner still, at the detector's
# first silent frame (SEMANTIC_SPECULATE_MS: one Silero window of 32 ms, one 20 ms energy frame), while the verdict is
# pending: at concurrency 1 the reply's own work (~250 ms on medium), not the verdict, is what the user waits for, so
# every window it starts sooner is heard. Voice coming back drops it unheard (speculation_gate.py bounds the cost).
SEMANTIC_PAUSE_MS = 100
SEMANTIC_SPECULATE_MS = 20
EAGERNESS_MAX_MS = {"low": 8000, "medium": 4000, "auto": 4000, "high": 2000}


class TurnJudge:
    def __init__(self, model: SmartTurn, rate: int, frame: int) -> None:
        """``rate``: the detector's sample rate; ``frame``: its samples per scored frame."""
        self.model, self.rate, self.frame = model, rate, frame
        self._pre = PRE_SPEECH_MS * rate // 1000
        self._keep = WINDOW_S * rate + self._pre
        self.last: float | None = None  # the latest probability of "complete" (None: not asked since the reset)
        self.reset()

    def reset(self) -> None:
        self._audio = np.zeros(0, np.float32)
        self._dropped = 0  # samples since the reset no longer kept

    def heard(self, samples: np.ndarray) -> None:
        """The detector scored these (whole frames, in order)."""
        audio = np.concatenate([self._audio, np.asarray(samples, dtype=np.float32)])
        cut = max(0, len(audio) - self._keep)
        self._audio, self._dropped = audio[cut:], self._dropped + cut

    def __call__(self, start: int, end: int) -> bool:
        """Whether the turn of frames ``[start, end)`` (the pause's silence included) is complete."""
        lo = max(0, start * self.frame - self._pre - self._dropped)
        audio = self._audio[lo:max(lo, end * self.frame - self._dropped)]
        if self.rate != RATE:
            audio = resample(audio, self.rate, RATE)
        self.last = self.model.probability(audio)
        logger.debug("smart turn: %.3f over %.2f s", self.last, len(audio) / RATE)
        return self.last > THRESHOLD
