"""What the transcription routes need from a family whose model is a speech recogniser (Qwen3-ASR), not a thinker
asked for a transcript in its chat template.

A :class:`TranscriptionPrompter` (``FrontEnd.transcriber``) makes one audio's prompt with the language forced and
the caller's context the way the model was trained, and gives a :class:`ReplyReader` per request that turns the
streamed reply into the transcript (a recogniser may open its reply with markup such as ``language X<asr_text>``).
A :class:`WordTimer` (``FrontEnd.word_timer``, a forced aligner served beside the model) times each word of a
transcript against its audio. Nothing here imports a family or torch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np

from omnistage.processing.prompt import ProcessedPrompt


class UnsupportedLanguage(ValueError):
    """A ``language`` the model cannot be forced into (the message names the ones it can)."""


class ReplyReader(Protocol):
    """One request's reply read delta by delta."""

    def feed(self, delta: str) -> str:
        """The transcript text this delta adds (markup held back or dropped)."""
        ...

    @property
    def language(self) -> str | None:
        """The language the reply named, when it named one."""
        ...


@runtime_checkable
class TranscriptionPrompter(Protocol):
    """A recogniser family's transcription prompts (called from worker threads, never on the event loop)."""

    translates: bool  # whether it can write an English translation (/v1/audio/translations)
    segment_seconds: float  # the longest piece of a file it writes down at once (longer files are cut)

    def check_language(self, language: str) -> None:
        """Raises :class:`UnsupportedLanguage` for a language the model cannot be forced into."""
        ...

    def transcription_prompt(self, audio: np.ndarray, language: str | None, context: str | None,
                             prefix: str = "") -> ProcessedPrompt:
        """One 16 kHz mono clip's prompt, ``language`` forced when given, ``context`` (earlier text) as context;
        ``prefix``: the transcript's opening, already written (a live transcript's), which the reply continues
        (it needs ``language``: the reply's markup comes before it)."""
        ...

    def reader(self, forced: bool) -> ReplyReader:
        """A reader for one reply (``forced``: its prompt forced the language)."""
        ...


class PlainReply:
    """A reply that is the transcript as it stands (a thinker's)."""

    language: str | None = None

    def feed(self, delta: str) -> str:
        return delta


@dataclass(frozen=True)
class WordTime:
    """One word of a transcript and where it is in its audio (seconds)."""

    word: str
    start: float
    end: float


@runtime_checkable
class WordTimer(Protocol):
    """A forced aligner: each word of a transcript timed in its audio (called from worker threads)."""

    max_seconds: float  # the longest audio it times at once (a file asking for words is cut to this)

    def align(self, audio: np.ndarray, transcript: str, language: str | None = None) -> Sequence[WordTime]:
        """The transcript's words (as the aligner splits them) with their times in ``audio`` (16 kHz mono)."""
        ...
