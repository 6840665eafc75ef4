"""Speech for ``omnistage bench realtime --turn-detection``: whole sentences, some with pauses inside them.

A turn detector is judged on two things: how soon it ends a finished sentence, and
whether it waits through a pause in an unfinished one. So each benchmark turn is one
spoken sentence; seven of the twelve stop once or twice mid-sentence for 300–700 ms (a
speaker searching for a word: after a function word, before the word searched for),
the others run through. espeak-ng speaks each sentence
whole, the pauses as SSML ``<break>``\\ s, so its intonation runs across them as one
sentence's would (a phrase spoken alone ends with a sentence's fall). The pause
lengths are drawn from a seeded generator: every run hears the same speech. Where the
pauses fell is read back from the audio (quiet runs of 250 ms or more: espeak leaves
none that long inside a sentence without punctuation). Without espeak-ng a voiced
stand-in with the same silences is used; a classifier has no words to judge in it.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from omnistage.tools.bench.realtime_speech import RATE

# "|" marks where a speaker might stop to think: inside the sentence, never at its end. Two placements of the same
# twelve sentences: HESITATIONS (the default) pause where people hesitate while searching for a word: after a
# function word ("the", "a", "of", "to", "is", "I"), before the content word that follows, where no sentence can
# end. PHRASE_BREAKS (this bench's first placement) pause at phrase boundaries, most of them where the words
# before could be a whole sentence ("I would like to know", "...going to the museum"): a listener cannot tell
# those from an end by the words alone either.
HESITATIONS = (
    "I would like to know what the | weather will be like tomorrow morning.",
    "Can you tell me how long it takes to drive to the airport?",
    "My sister and I were thinking of | going to the | museum on Saturday afternoon.",
    "Please book a table for four people at the Italian restaurant.",
    "The thing I keep forgetting is | where I put the keys to the garage.",
    "What time does the | last train leave for the city center?",
    "I need to buy some | bread and a | bottle of milk before the shop closes.",
    "Turn off the lights in the kitchen and the living room.",
    "Could you remind me to | call my mother when I | get home tonight?",
    "How many days are left until the end of the month?",
    "We should leave a | little earlier because of the | heavy traffic downtown.",
    "Play some quiet music while I read my book.",
)
PHRASE_BREAKS = (
    "I would like to know | what the weather will be like tomorrow morning.",
    "Can you tell me how long it takes to drive to the airport?",
    "My sister and I were thinking of | going to the museum | on Saturday afternoon.",
    "Please book a table for four people at the Italian restaurant.",
    "The thing I keep forgetting is | where I put the keys to the garage.",
    "What time does the last train leave | for the city center?",
    "I need to buy some bread | and a bottle of milk | before the shop closes.",
    "Turn off the lights in the kitchen and the living room.",
    "Could you remind me | to call my mother | when I get home tonight?",
    "How many days are left until the end of the month?",
    "We should probably | leave a little earlier | because of the traffic.",
    "Play some quiet music while I read my book.",
)
PLACEMENTS = {"hesitation": HESITATIONS, "phrase": PHRASE_BREAKS}
SENTENCES = HESITATIONS
PAUSE_S = (0.3, 0.7)  # a mid-sentence pause's length, drawn uniformly
MIN_PAUSE_S = 0.25  # a quiet run this long inside a sentence is one of its pauses
LEVEL = 1e-3


@dataclass(frozen=True)
class Sentence:
    text: str
    audio: np.ndarray  # 24 kHz float32, trimmed to its speech
    pauses: tuple[tuple[float, float], ...]  # (start, end) seconds of each pause inside it

    @property
    def seconds(self) -> float:
        return len(self.audio) / RATE


def ssml(text: str, pauses_s: list[float]) -> str:
    parts = [p.strip() for p in text.split("|")]
    body = "".join(f'{part} <break time="{round(s * 1000)}ms"/> ' for part, s in zip(parts, pauses_s)) + parts[-1]
    return f"<speak>{body}</speak>"


def quiet_runs(audio: np.ndarray, min_s: float = MIN_PAUSE_S) -> list[tuple[float, float]]:
    """(start, end) seconds of each quiet run of ``min_s`` or more (10 ms frames under ``LEVEL``)."""
    frame = RATE // 100
    n = len(audio) // frame
    loud = np.abs(audio[:n * frame]).reshape(n, frame).max(axis=1) > LEVEL
    runs, start = [], None
    for i, is_loud in enumerate([*loud, True]):
        if not is_loud and start is None:
            start = i
        elif is_loud and start is not None:
            if i - start >= min_s * 100:
                runs.append((start / 100, i / 100))
            start = None
    return runs


def trimmed(audio: np.ndarray) -> np.ndarray:
    loud = np.flatnonzero(np.abs(audio) > LEVEL)
    return audio[loud[0]:loud[-1] + 1] if len(loud) else audio


def _espeak(markup: str, voice: str | None = None) -> np.ndarray:
    """``voice``: an espeak-ng voice (``en-us``, ``en-us+f3``...; None: its default)."""
    import soundfile as sf

    from omnistage.audio.decode import resample

    with tempfile.TemporaryDirectory() as tmp:
        wav = Path(tmp) / "sentence.wav"
        chosen = ["-v", voice] if voice else []
        subprocess.run(["espeak-ng", "-m", *chosen, "-w", str(wav), markup], check=True, capture_output=True,
                       timeout=60)
        samples, rate = sf.read(wav, dtype="float32")
    if samples.ndim > 1:
        samples = samples.mean(axis=1)
    return resample(samples, rate, RATE).astype(np.float32)


def _stand_in(text: str, pauses_s: list[float]) -> np.ndarray:
    """A voiced 3 Hz syllable rhythm, a phrase per part (0.3 s a word), the pauses silent."""
    pieces = []
    for i, part in enumerate(text.split("|")):
        t = np.arange(int(0.3 * len(part.split()) * RATE)) / RATE
        voice = sum(np.sin(2 * np.pi * 150 * k * t) / k for k in range(1, 8))
        pieces.append((0.3 * voice * (np.sin(2 * np.pi * 3 * t) > -0.5) / np.abs(voice).max()).astype(np.float32))
        if i < len(pauses_s):
            pieces.append(np.zeros(int(pauses_s[i] * RATE), np.float32))
    return np.concatenate(pieces)


def sentences(seed: int = 0, placement: str = "hesitation", voice: str | None = None) -> tuple[list[Sentence], str]:
    """The benchmark's sentences (``placement``: where they pause, ``PLACEMENTS``) and where their voice came from
    ("espeak-ng" or "synthetic"); ``voice``: espeak-ng's voice (None: its default)."""
    rng = np.random.default_rng(seed)
    voiced = shutil.which("espeak-ng") is not None
    made = []
    for text in PLACEMENTS[placement]:
        pauses_s = [float(rng.uniform(*PAUSE_S)) for _ in range(text.count("|"))]
        audio = trimmed(_espeak(ssml(text, pauses_s), voice) if voiced else _stand_in(text, pauses_s))
        made.append(Sentence(text.replace(" | ", " "), audio, tuple(quiet_runs(audio))))
    return made, "espeak-ng" if voiced else "synthetic"
