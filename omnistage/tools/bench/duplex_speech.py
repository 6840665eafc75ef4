"""The user side of ``omnistage bench duplex``: espeak-ng speech as the checkpoint's Mimi codes, one track a session.

Each session hears the realtime bench's twelve sentences (``realtime_sentences``: espeak-ng, or its voiced
stand-in without it), starting at its own sentence, each followed by a second of silence so the agent may answer.
The track is encoded before the clock starts, by transformers' Mimi with the checkpoint's codec weights: the
timed loop measures the duplex engine, not the encoder (omnistage's streaming Mimi stage is the codec's own
measurement).
"""

from __future__ import annotations

from pathlib import Path

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


def load_mimi(folder: Path):  # noqa: ANN201 - transformers' MimiModel
    """The checkpoint's Mimi through transformers: ``mimi/`` (Kyutai's layout as make-tiny writes it) or the
    ``audio_encoder`` of transformers' layout."""
    from transformers import MimiModel, MoshiForConditionalGeneration

    if (folder / "mimi" / "config.json").is_file():
        return MimiModel.from_pretrained(folder / "mimi", dtype=torch.float32).eval()
    return MoshiForConditionalGeneration.from_pretrained(folder, dtype=torch.float32).audio_encoder.eval()


@torch.inference_mode()
def user_tracks(folder: Path, sessions: int, seconds: float, codebooks: int) -> list[torch.Tensor]:
    """Each session's codes [frames, K]; sessions share the encoding of a sentence order's rotation."""
    mimi = load_mimi(folder)
    encoded: dict[int, torch.Tensor] = {}
    for start in sorted({k % len(sentences()[0]) for k in range(sessions)}):
        audio = torch.from_numpy(conversation(start, seconds))[None, None]
        encoded[start] = mimi.encode(audio, num_quantizers=codebooks)[0][0].T.contiguous()
    return [encoded[k % len(encoded)] for k in range(sessions)]
