"""Qwen3-ASR's :class:`omnistage.processing.transcription.TranscriptionPrompter`: its prompt (:mod:`.prompt`) and a
reply reader that holds back an unforced reply's ``language X<asr_text>`` opening, so a stream carries only the
transcript and the detected language is read off the markup."""

from __future__ import annotations

import numpy as np

from omnistage.families.qwen3_asr.prompt import ASR_TEXT, ASRPromptIds, Qwen3ASRPromptProcessor, UnknownLanguage, \
    language_name
from omnistage.processing.transcription import PlainReply, UnsupportedLanguage


class ASRReply:
    """An unforced reply: text before ``<asr_text>`` is the language line, held back; after it, the transcript."""

    def __init__(self) -> None:
        self._head = ""
        self._open = False
        self.language: str | None = None

    def feed(self, delta: str) -> str:
        if self._open:
            return delta
        self._head += delta
        if ASR_TEXT not in self._head:
            return ""
        head, _, body = self._head.partition(ASR_TEXT)
        name = head.strip().removeprefix("language").strip()
        self.language = None if name.lower() in ("", "none") else name
        self._open = True
        return body


class ASRTranscriber:
    translates = False  # Qwen3-ASR writes what it hears in the language it hears
    # As Qwen's qwen-asr (MAX_ASR_INPUT_SECONDS): the encoder's windowed attention reads 20 minutes in one prompt.
    segment_seconds = 1200.0

    def __init__(self, processor: Qwen3ASRPromptProcessor) -> None:
        self.processor = processor

    def check_language(self, language: str) -> None:
        try:
            language_name(language)
        except UnknownLanguage as exc:
            raise UnsupportedLanguage(str(exc)) from exc

    def transcription_prompt(self, audio: np.ndarray, language: str | None, context: str | None,
                             prefix: str = "") -> ASRPromptIds:
        return self.processor.prompt(audio, language, context, prefix)

    def reader(self, forced: bool) -> PlainReply | ASRReply:
        return PlainReply() if forced else ASRReply()
