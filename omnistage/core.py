"""Shared types at the boundary between the front end (API, Python API) and the pipeline.

The front end turns a user's request into an ``OmniRequest`` (its prompt made by
the served model family's request preparation); the pipeline streams back
``OmniOutput`` deltas. Nothing here depends on torch models.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from omnistage.engine.logprobs import TokenLogprob
from omnistage.engine.request import FinishReason
from omnistage.sampling_params import SamplingParams



class Modality(str, enum.Enum):
    TEXT = "text"
    AUDIO = "audio"


@dataclass(frozen=True)
class UnspokenSpan:
    """Thinker text the talker must not speak: what lies between a token ``open_id`` and a token ``close_id``
    (both included), e.g. a tool call. ``open_at_start``: the answer begins inside one (its prompt ended with the
    opening, a forced tool call)."""

    open_id: int
    close_id: int
    open_at_start: bool = False


class Prompt(Protocol):
    """A request's input as its model family's request preparation made it (Qwen3-Omni: a processed chat
    prompt; Qwen3-TTS: a tokenised speech input); the family turns it into its entry stage's input."""

    @property
    def num_tokens(self) -> int: ...


class PromptDelta(Protocol):
    """More of a running request's input, as its family's front end made it (Qwen3-TTS: the next ids of a text
    still being written); the family turns it into its entry stage's input (``Family.entry_feed``)."""

    @property
    def num_tokens(self) -> int: ...

    @property
    def done(self) -> bool:
        """The input ends with this delta."""
        ...


@dataclass(frozen=True)
class OmniRequest:
    request_id: str
    prompt: Prompt
    modalities: frozenset[Modality] = frozenset({Modality.TEXT})
    # The entry stage's (the thinker's, a TTS talker's); a request built without one stops at 256 tokens.
    sampling: SamplingParams = SamplingParams(max_tokens=256)
    voice: str = ""  # a speaker of the checkpoint; "": the family's default voice
    # Frames in the first code2wav chunk (None = chosen by load).
    initial_codec_chunk_frames: int | None = None
    # When the caller starts playing this reply (``time.monotonic()`` on the serving host; None: as its audio
    # arrives). A realtime speculative reply is played only from the user's turn's end: until then frames pile
    # up, so a request that starts before that moment (its head start) may take a smaller first chunk than one
    # played at once could afford, at any load; one its audio gate held past it gets the chunk of its load.
    plays_at: float | None = None
    # The caller plays the audio as it arrives: later chunks are sized to keep its player fed. False: the audio
    # is consumed whole, so every later chunk takes the stage's full chunk size (fewer vocoder calls).
    stream: bool = True
    unspoken: UnspokenSpan | None = None  # decided by the front end (tool calls); None: every token is spoken
    # Only warms the prefix caches of the stages its reply would use (realtime streaming input prefills the
    # user's turn while it is spoken): with AUDIO the stages up to the talker run their prefill and one step, the
    # audio stage never runs, nothing waits at the audio gate; its text is one token the caller ignores.
    prefill_only: bool = False
    # The W3C ``traceparent`` of the caller's span (the HTTP request's), which this request's pipeline spans go
    # under when the server traces (``--otlp-traces-endpoint``); None: they start a trace of their own.
    traceparent: str | None = None
    # Its input is still being written (text spoken as it is written): more comes through ``OmniEngine.feed`` until
    # a delta that is ``done``. Until then its talker runs at the writer's pace, not its own.
    open_input: bool = False

    @property
    def wants_audio(self) -> bool:
        return Modality.AUDIO in self.modalities

    @property
    def streams_audio(self) -> bool:
        """Whether audio comes back: a prefill-only request wanting audio warms the talker and makes none."""
        return self.wants_audio and not self.prefill_only


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = 0  # of prompt_tokens, those served from the thinker's prefix cache

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


@dataclass(frozen=True)
class OmniOutput:
    """One streamed delta of a request: new text and/or a new audio chunk.

    The last output of a request has ``finished=True`` and its ``finish_reason``;
    ``error`` carries the message when ``finish_reason`` is ERROR.
    """

    request_id: str
    text: str = ""
    token_ids: tuple[int, ...] = ()
    audio: np.ndarray | None = None  # float32 mono at the family's rate (``FrontEnd.audio.sample_rate``)
    finished: bool = False
    finish_reason: FinishReason | None = None
    usage: Usage | None = None
    error: str | None = None
    logprobs: tuple[TokenLogprob, ...] = ()  # of token_ids, when the request asked

    @staticmethod
    def merge(outputs: Sequence[OmniOutput]) -> OmniOutput:
        """Consecutive deltas of one request as one: their text, tokens, logprobs and audio joined, the last one's
        ending."""
        if len(outputs) == 1:
            return outputs[0]
        last = outputs[-1]
        chunks = [o.audio for o in outputs if o.audio is not None]
        audio = np.concatenate(chunks).astype(np.float32, copy=False) if chunks else None
        return OmniOutput(last.request_id, text="".join(o.text for o in outputs),
                          token_ids=tuple(t for o in outputs for t in o.token_ids), audio=audio,
                          finished=last.finished, finish_reason=last.finish_reason, usage=last.usage,
                          error=last.error, logprobs=tuple(p for o in outputs for p in o.logprobs))
