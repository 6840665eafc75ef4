"""A transcript's segments in the form the client asked for: json, text, srt, vtt or verbose_json.

Every timing is a segment boundary in the uploaded audio (``segments.py``), never an estimate inside one: a
subtitle cue spans the piece of audio its text was transcribed from.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable
from dataclasses import dataclass

from fastapi.responses import JSONResponse, PlainTextResponse, Response

from omnistage.core import Usage
from omnistage.entrypoints.openai.common.transcriber import TranscriptDone
from omnistage.entrypoints.openai.transcription.protocol import (
    Transcription,
    TranscriptionDurationUsage,
    TranscriptionForm,
    TranscriptionSegment,
    TranscriptionTokenUsage,
    TranscriptionVerbose,
    TranscriptionWord,
    Translation,
    TranslationVerbose,
)
from omnistage.entrypoints.openai.transcription.segments import Segment
from omnistage.processing.prompt import AUDIO_SAMPLE_RATE
from omnistage.processing.transcription import WordTime


@dataclass(frozen=True)
class SegmentText:
    """One segment of the audio and how the thinker wrote it down."""

    segment: Segment
    done: TranscriptDone
    words: tuple[WordTime, ...] = ()  # the aligner's, in the file's time (when words were asked for)

    @property
    def start(self) -> float:
        return self.segment.start / AUDIO_SAMPLE_RATE

    @property
    def end(self) -> float:
        return self.segment.end / AUDIO_SAMPLE_RATE


@dataclass(frozen=True)
class TranscriptResult:
    segments: tuple[SegmentText, ...]
    duration: float  # seconds of the decoded audio

    @property
    def text(self) -> str:
        return join_texts(s.done.text for s in self.segments)

    @property
    def language(self) -> str | None:
        """The language the first segment's reply named (a recogniser detects it), lower-case as OpenAI's."""
        named = next((s.done.language for s in self.segments if s.done.language), None)
        return named.lower() if named else None

    @property
    def usage(self) -> Usage:
        return Usage(sum(s.done.usage.prompt_tokens for s in self.segments),
                     sum(s.done.usage.completion_tokens for s in self.segments))


# Scripts written without spaces between words: two segments meeting in one are joined with nothing between them
# (a space inside Chinese or Japanese text is a mistake a reader sees). Korean spaces its words, so Hangul is not here.
_UNSPACED = ((0x0E00, 0x0EFF),  # Thai, Lao
             (0x1000, 0x109F),  # Myanmar
             (0x1780, 0x17FF),  # Khmer
             (0x3000, 0x30FF),  # CJK punctuation, Hiragana, Katakana
             (0x3400, 0x4DBF), (0x4E00, 0x9FFF), (0xF900, 0xFAFF),  # CJK ideographs
             (0xFF00, 0xFFEF),  # fullwidth and halfwidth forms
             (0x20000, 0x3FFFF))  # CJK ideographs, supplementary planes


def _unspaced(char: str) -> bool:
    code = ord(char)
    return any(low <= code <= high for low, high in _UNSPACED)


def segment_separator(before: str, after: str) -> str:
    """What goes between two segments' stripped texts: one space, or nothing where either side is a script
    written without spaces."""
    if not before or not after or _unspaced(before[-1]) or _unspaced(after[0]):
        return ""
    return " "


def join_texts(texts: Iterable[str]) -> str:
    """Segments' texts joined by :func:`segment_separator` (each already stripped; empty ones dropped)."""
    joined = ""
    for text in texts:
        if text:
            joined += segment_separator(joined, text) + text
    return joined


class DeltaJoiner:
    """Streamed deltas of several segments made into the text ``TranscriptResult.text`` is: each segment's
    text stripped, segments joined by :func:`segment_separator`. Trailing spaces are held back until more text
    follows."""

    def __init__(self) -> None:
        self.parts: list[str] = []
        self._segment = -1
        self._opened = False  # the current segment has shown text
        self._held = ""

    def feed(self, index: int, text: str) -> str:
        """The delta to send for ``text`` of segment ``index`` ("" when nothing is to be sent yet)."""
        if index != self._segment:
            self._segment, self._opened, self._held = index, False, ""
        if not self._opened:
            text = text.lstrip()
        body = text.rstrip()
        if not body:
            self._held += text if self._opened else ""
            return ""
        lead = self._held if self._opened else (segment_separator(self.parts[-1], body) if self.parts else "")
        self._opened, self._held = True, text[len(body):]
        self.parts.append(lead + body)
        return self.parts[-1]

    @property
    def text(self) -> str:
        return "".join(self.parts)


def token_usage(usage: Usage) -> TranscriptionTokenUsage:
    return TranscriptionTokenUsage(input_tokens=usage.prompt_tokens, output_tokens=usage.completion_tokens,
                                   total_tokens=usage.total_tokens)


def _compression_ratio(text: str) -> float:
    data = text.encode("utf-8")
    return len(data) / len(zlib.compress(data)) if data else 0.0


def verbose_segments(result: TranscriptResult, temperature: float) -> list[TranscriptionSegment]:
    out = []
    for i, piece in enumerate(result.segments):
        logprobs = piece.done.logprobs
        out.append(TranscriptionSegment(
            id=i, seek=round(piece.start * 100), start=round(piece.start, 3), end=round(piece.end, 3),
            text=piece.done.text, tokens=list(piece.done.token_ids), temperature=temperature,
            avg_logprob=sum(logprobs) / len(logprobs) if logprobs else 0.0,
            compression_ratio=_compression_ratio(piece.done.text)))
    return out


def _clock(seconds: float, decimal: str) -> str:
    ms = round(seconds * 1000)
    hours, ms = divmod(ms, 3_600_000)
    minutes, ms = divmod(ms, 60_000)
    secs, ms = divmod(ms, 1000)
    return f"{hours:02d}:{minutes:02d}:{secs:02d}{decimal}{ms:03d}"


def srt(result: TranscriptResult) -> str:
    cues = [s for s in result.segments if s.done.text]
    return "".join(f"{n}\n{_clock(s.start, ',')} --> {_clock(s.end, ',')}\n{s.done.text}\n\n"
                   for n, s in enumerate(cues, start=1))


def vtt(result: TranscriptResult) -> str:
    cues = [s for s in result.segments if s.done.text]
    return "WEBVTT\n\n" + "".join(f"{_clock(s.start, '.')} --> {_clock(s.end, '.')}\n{s.done.text}\n\n"
                                  for s in cues)


def _verbose(result: TranscriptResult, form: TranscriptionForm) -> TranscriptionVerbose | TranslationVerbose:
    segments = verbose_segments(result, form.sampling_temperature)
    duration = round(result.duration, 3)
    if form.translate:
        return TranslationVerbose(duration=duration, text=result.text, segments=segments)
    words = [TranscriptionWord(word=w.word, start=round(w.start, 3), end=round(w.end, 3))
             for s in result.segments for w in s.words] if form.wants_words else None
    segments_asked = "segment" in form.granularities or not form.wants_words  # whisper-1: segments by default
    return TranscriptionVerbose(duration=duration, language=form.language or result.language or "unknown",
                                text=result.text, segments=segments if segments_asked else None, words=words,
                                usage=TranscriptionDurationUsage(seconds=duration))


def render(result: TranscriptResult, form: TranscriptionForm) -> Response:
    """The whole response for ``form.response_format``."""
    if form.response_format == "text":
        return PlainTextResponse(result.text)
    if form.response_format == "srt":
        return PlainTextResponse(srt(result))
    if form.response_format == "vtt":
        return PlainTextResponse(vtt(result), media_type="text/vtt")
    if form.response_format == "verbose_json":
        return JSONResponse(_verbose(result, form).model_dump(exclude_none=True))
    body = Translation(text=result.text) if form.translate else \
        Transcription(text=result.text, usage=token_usage(result.usage))
    return JSONResponse(body.model_dump(exclude_none=True))
