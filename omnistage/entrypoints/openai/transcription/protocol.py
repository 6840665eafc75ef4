"""``/v1/audio/transcriptions`` and ``/v1/audio/translations``: the form's fields read into one typed ask, and
the response bodies and stream events in the shapes of the openai SDK's ``types/audio`` (``Transcription``,
``TranscriptionVerbose``, ``TranscriptionSegment``, ``Translation``, ``TranslationVerbose``,
``TranscriptionTextDeltaEvent``, ``TranscriptionTextDoneEvent``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel

from omnistage.entrypoints.openai.common.errors import bad_request, quoted

ResponseFormat = Literal["json", "text", "srt", "verbose_json", "vtt"]
Granularity = Literal["word", "segment"]
STREAMED_FORMATS = ("json", "text")
NO_WORDS = ("timestamp_granularities=['word'] is not supported: the model writes each segment's text without "
            "word timings, and this server does not make up timings it cannot measure; ask for 'segment' "
            "(response_format=verbose_json gives each segment's start and end), or serve a forced aligner beside "
            "the model (omnistage serve MODEL --aligner ALIGNER_DIR)")


@dataclass(frozen=True)
class TranscriptionForm:
    """One transcription or translation request's fields, checked (``check``) before the file is read."""

    model: str
    translate: bool = False
    language: str | None = None
    prompt: str | None = None
    response_format: ResponseFormat = "json"
    temperature: float | None = None
    granularities: tuple[Granularity, ...] = ()
    stream: bool = False
    include: tuple[str, ...] = ()
    chunking_strategy: str | None = None

    @property
    def wants_words(self) -> bool:
        return "word" in self.granularities

    def check(self, words: bool = False) -> None:
        """``words``: a forced aligner is served, so ``timestamp_granularities=['word']`` can be honoured."""
        if self.language is not None and not (2 <= len(self.language) <= 3 and self.language.isalpha()):
            raise bad_request(f"language takes an ISO-639-1 code (e.g. 'en'), got {quoted(self.language)}",
                              param="language", code="invalid_value")
        if self.wants_words and not words:
            raise bad_request(NO_WORDS, param="timestamp_granularities", code="unsupported_value")
        if self.granularities and self.response_format != "verbose_json":
            raise bad_request("timestamp_granularities needs response_format=verbose_json",
                              param="timestamp_granularities", code="invalid_value")
        if self.stream and self.response_format not in STREAMED_FORMATS:
            raise bad_request(f"stream=true sends transcript.text events; response_format must be json or text, "
                              f"not {self.response_format}", param="stream", code="invalid_value")
        if self.include:
            raise bad_request(f"include={list(self.include)} is not supported (no per-token logprobs here; "
                              f"verbose_json's segments carry avg_logprob)", param="include", code="unsupported_value")
        if self.chunking_strategy not in (None, "auto"):
            raise bad_request("chunking_strategy takes 'auto' only: the audio is always cut into windows of at most "
                              "30 s at quiet moments", param="chunking_strategy", code="unsupported_value")

    @property
    def sampling_temperature(self) -> float:
        """OpenAI's 0 (and an unset temperature) is greedy decoding here: no temperature fallback."""
        return self.temperature or 0.0


class TranscriptionTokenUsage(BaseModel):
    """Token usage, as gpt-4o-transcribe reports it (``json`` and the stream's done event)."""

    type: Literal["tokens"] = "tokens"
    input_tokens: int
    output_tokens: int
    total_tokens: int


class TranscriptionDurationUsage(BaseModel):
    """Duration usage, as whisper-1 reports it (``verbose_json``)."""

    type: Literal["duration"] = "duration"
    seconds: float


class Transcription(BaseModel):
    text: str
    usage: TranscriptionTokenUsage | None = None


class TranscriptionSegment(BaseModel):
    """One piece of the audio as the thinker wrote it down: ``start``/``end`` are the piece's boundaries in the
    audio (seconds), ``tokens`` the thinker's generated ids, ``avg_logprob`` their mean log-probability,
    ``compression_ratio`` the text's length over its zlib-compressed length; ``no_speech_prob`` is not
    estimated (always 0)."""

    id: int
    seek: int  # the segment's start in 10 ms frames, as Whisper's
    start: float
    end: float
    text: str
    tokens: list[int]
    temperature: float
    avg_logprob: float
    compression_ratio: float
    no_speech_prob: float = 0.0


class TranscriptionWord(BaseModel):
    """One word and where it is in the audio (seconds), as the forced aligner served beside the model timed it."""

    word: str
    start: float
    end: float


class TranscriptionVerbose(BaseModel):
    duration: float
    language: str  # the request's ``language``, else the one the recogniser named ("unknown": neither)
    text: str
    segments: list[TranscriptionSegment] | None = None
    words: list[TranscriptionWord] | None = None
    usage: TranscriptionDurationUsage | None = None


class Translation(BaseModel):
    text: str


class TranslationVerbose(BaseModel):
    duration: float
    language: Literal["english"] = "english"
    text: str
    segments: list[TranscriptionSegment] | None = None


class TranscriptTextDelta(BaseModel):
    type: Literal["transcript.text.delta"] = "transcript.text.delta"
    delta: str


class TranscriptTextDone(BaseModel):
    type: Literal["transcript.text.done"] = "transcript.text.done"
    text: str
    usage: TranscriptionTokenUsage | None = None
