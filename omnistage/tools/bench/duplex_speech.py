"""The user side of ``omnistage bench duplex``: espeak-ng speech as the checkpoint's Mimi codes, one track a session.

Each session hears the realtime bench's twelve sentences (``realtime_sentences``: espeak-ng, or its voiced
stand-in without it), starting at its own sentence, each followed by a second of silence so the agent may answer.
Each track is cut into the codec's frames (1920 samples at 24 kHz) that a client would send every 80 ms.
"""

from __future__ import annotations

import numpy as np
import torch

from omnistage.tools.bench.realtime_sentences import sentences
from omnistage.tools.bench.realtime_speech import RATE

GAP_S = 1.0


def conversation(start: int, seconds: float, seed: int = 0) -> np.ndarray:
    """``seconds`` of 24 kHz speech: the sentences from ``start`` on, each followed by ``GAP_S`` of silence."""
    spoken, _ = sentences(seed)
    pieces, total, i = [], 0, start
    while total < seconds * RATE:
        s = spoken[i % len(spoken)].audio
        pieces += [s, np.zeros(int(GAP_S * RATE), np.float32)]
        total += len(s) + int(GAP_S * RATE)
        i += 1
    return np.concatenate(pieces)[:int(seconds * RATE)]


def user_tracks(sessions: int, seconds: float, frame_size: int) -> list[torch.Tensor]:
    """Each session's audio as frames [frames, S] (rotations of the sentences, shared past twelve sessions)."""
    count = len(sentences()[0])
    frames = {}
    for start in sorted({k % count for k in range(sessions)}):
        audio = torch.from_numpy(conversation(start, seconds))
        n = len(audio) // frame_size
        frames[start] = audio[:n * frame_size].view(n, frame_size)
    return [frames[k % count] for k in range(sessions)]
