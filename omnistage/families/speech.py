"""Text-to-speech preparation: what a family that is a TTS model gives the speech API.

The server never names a TTS family: ``/v1/audio/speech`` (and the speech
WebSocket) hand a :class:`SpeechAsk` to the served checkpoint's
:class:`SpeechFrontEnd`, which validates it against the checkpoint (its
speakers, whether it takes instructions) and returns the request's prompt. A
family that ``takes_text_deltas`` also speaks text as it is written: its
:class:`SpokenText` opens the request on the first words and feeds it the rest.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np

from omnistage.core import Prompt, PromptDelta

# OpenAI's voice names, which some clients allow alone: a family with other speakers maps them onto its own.
OPENAI_VOICE_NAMES = ("alloy", "ash", "ballad", "coral", "echo", "fable", "onyx", "nova", "sage", "shimmer", "verse",
                      "marin", "cedar")
# How a registered voice was cloned: the reference audio in the prompt, or a speaker embedding (x-vector) alone.
CloneMode = Literal["in_context", "x_vector"]


@dataclass(frozen=True)
class ContextTurn:
    """An earlier turn of the conversation the utterance continues (a conversational model's context): who said
    it (one of the front end's ``speakers``), what was said, and how it sounded (mono, finite samples)."""

    speaker: str
    text: str
    samples: np.ndarray
    sample_rate: int


@dataclass(frozen=True)
class SpeechAsk:
    """One utterance as a caller asks for it. ``voice``: a speaker name, resolved by the API (None when the
    checkpoint has no named speakers); ``instructions``: how to speak (or, for a voice-design model, the voice);
    ``context``: earlier turns, oldest first (a front end that ``takes_context``)."""

    text: str
    voice: str | None = None
    instructions: str | None = None
    language: str = "auto"
    clone: object | None = None  # a registered voice, as the front end's load_voice read it
    context: tuple[ContextTurn, ...] = ()


@dataclass(frozen=True)
class TextStep:
    """What an utterance's text written so far gives (:meth:`SpokenText.add`): the request's prompt once the model
    can start speaking (``opening``, once), then more of its input for the running request (``more``)."""

    opening: Prompt | None = None
    more: PromptDelta | None = None


class SpokenText(ABC):
    """One utterance spoken as its text is written (an LLM's deltas), for a family that takes text deltas."""

    @abstractmethod
    def add(self, text: str, done: bool = False) -> TextStep:
        """The next piece of text (``done``: the text ends here); ``ValueError`` for what cannot be said (runs in
        a worker thread: it tokenises). An opening before the text's end is followed by ``more`` until one that
        is ``done``; an opening at its end is the whole prompt."""

    @abstractmethod
    def max_frames(self, prompt: Prompt) -> int:
        """Codec frames an opening prompt may run to while its text is open (its context's room)."""


class SpeechFrontEnd(ABC):
    """speakers: the names ``voice`` may take (empty when the checkpoint's voice is not a named speaker).
    needs_instructions: the voice comes from ``instructions`` (a voice-design model).
    clones_voices: ``voice`` names a voice registered from reference audio (``clone_voice``, stored by the server
    with ``save_voice``, read back with ``load_voice``).
    takes_context: the utterance continues a conversation given as earlier turns (``SpeechAsk.context``), each
    said by one of ``speakers``."""

    speakers: tuple[str, ...] = ()
    needs_instructions: bool = False
    clones_voices: bool = False
    takes_context: bool = False
    takes_text_deltas: bool = False  # speaks text as it is written (``spoken_text``); else text is cut in sentences

    def spoken_text(self, ask: SpeechAsk, room: int) -> SpokenText:
        """An utterance whose text ``ask`` does not hold yet (its voice and settings checked now, ``ValueError``),
        in at most ``room`` positions of the entry stage's context."""
        raise ValueError("this checkpoint speaks whole sentences, not text as it is written")

    def clone_voice(self, samples: np.ndarray, sample_rate: int, transcript: str | None) -> object:
        """A voice from mono reference audio (and its transcript, if known); ``ValueError`` for bad input."""
        raise ValueError("this checkpoint does not clone voices")

    def clone_mode(self, transcript: str | None) -> CloneMode:
        """How ``clone_voice`` uses what it is given, as the voices API reports it: ``in_context`` (the reference
        audio itself prompts the model; every family but Qwen3-TTS, with or without a transcript)."""
        return "in_context"

    def save_voice(self, voice: object, folder: Path) -> None:
        raise ValueError("this checkpoint does not clone voices")

    def load_voice(self, folder: Path) -> object:
        raise ValueError("this checkpoint does not clone voices")

    @abstractmethod
    def prompt(self, ask: SpeechAsk) -> Prompt:
        """The request's prompt; ``ValueError`` with a client-facing message for what this checkpoint cannot
        say (runs in a worker thread: it tokenises)."""

    @abstractmethod
    def max_frames(self, prompt: Prompt, room: int) -> int:
        """Codec frames a prompt may run to (a bound on a talker that does not stop), at most ``room``."""
