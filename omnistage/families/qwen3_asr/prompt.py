"""Qwen3-ASR's prompt: the context as the system turn, the audio as the user turn, the language forced by the
assistant turn's opening ``language X<asr_text>`` (as transformers' ``apply_transcription_request`` and Qwen's
``qwen-asr`` write it).

The ids are laid out directly (``<|im_start|>system\\n{context}<|im_end|>\\n<|im_start|>user\\n<|audio_start|>
<|audio_pad|>×n<|audio_end|><|im_end|>\\n<|im_start|>assistant\\n``), the context tokenized as plain text (a
client's ``<|im_end|>`` stays text). Features are the checkpoint's own log-mel (``Qwen3ASRFeatureExtractor``), kept
as each audio's valid frames, what the encoder reads.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from omnistage.models.qwen3_audio_encoder import audio_output_length
from omnistage.processing.prompt import AUDIO_SAMPLE_RATE

ASR_TEXT = "<asr_text>"
_EXTRACTOR_KEYS = ("feature_size", "hop_length", "n_fft", "chunk_length", "dither", "n_window")


class UnknownLanguage(ValueError):
    """A language the model was not trained to be forced into (the message names the known ones)."""


@dataclass(frozen=True)
class ASRPromptIds:
    """The prompt ids of one audio and its valid mel frames ``[mel, n]`` (the encoder's input)."""

    token_ids: list[int]
    mels: list[torch.Tensor] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)


def language_names() -> dict[str, str]:
    """ISO 639-1 code -> the full name the model was trained on (transformers' table)."""
    from transformers.models.qwen3_asr.processing_qwen3_asr import LANGUAGE_CODE_TO_NAME

    return dict(LANGUAGE_CODE_TO_NAME)


def language_name(language: str) -> str:
    """An ISO code or a full name (any case) as the model's name for it; :class:`UnknownLanguage` otherwise."""
    names = language_names()
    found = names.get(language.lower()) or next((n for n in names.values() if n.lower() == language.lower()), None)
    if found is None:
        raise UnknownLanguage(f"language {language!r} is not one Qwen3-ASR knows; use one of "
                              f"{', '.join(sorted(names))} (ISO 639-1) or their names")
    return found


class Qwen3ASRPromptProcessor:
    """Builds prompts and reads replies (called from worker threads, never on the event loop)."""

    def __init__(self, folder: str | Path, n_window: int) -> None:
        from transformers import AutoTokenizer
        from transformers.models.qwen3_asr.feature_extraction_qwen3_asr import Qwen3ASRFeatureExtractor

        self.tokenizer = AutoTokenizer.from_pretrained(str(folder))
        raw = json.loads((Path(folder) / "preprocessor_config.json").read_text())
        self.features = Qwen3ASRFeatureExtractor(**{k: raw[k] for k in _EXTRACTOR_KEYS if k in raw})
        self.n_window = n_window
        self._head = self._ids("<|im_start|>system\n")
        self._user = self._ids("<|im_end|>\n<|im_start|>user\n")
        self._audio = [self.tokenizer.convert_tokens_to_ids(t) for t in ("<|audio_start|>", "<|audio_pad|>",
                                                                          "<|audio_end|>")]
        self._tail = self._ids("<|im_end|>\n<|im_start|>assistant\n")

    def _ids(self, markup: str) -> list[int]:
        return list(self.tokenizer.encode(markup, add_special_tokens=False))

    def mel(self, audio: np.ndarray) -> torch.Tensor:
        """The valid log-mel frames ``[mel, n]`` of one 16 kHz mono clip, as transformers' processor makes them."""
        out = self.features([np.asarray(audio, dtype=np.float32)], sampling_rate=AUDIO_SAMPLE_RATE, padding=True,
                            truncation=False, return_attention_mask=True, return_tensors="pt")
        frames = int(out["attention_mask"][0].sum())
        return out["input_features"][0, :, :frames].contiguous()

    def prompt(self, audio: np.ndarray, language: str | None = None, context: str | None = None,
               prefix: str = "") -> ASRPromptIds:
        """One audio's prompt; ``language`` (ISO code or name) forced, ``context`` (OpenAI's ``prompt``) as the
        system turn; ``prefix``: the transcript's opening, after the language's markup, for the reply to continue
        (as qwen-asr's streaming re-runs carry their earlier text)."""
        forced = language_name(language) if language else None
        if prefix and not forced:
            raise ValueError("a transcript's opening follows its language line: give its language too")
        audio_part = self.audio_prompt(audio)
        text = list(self.tokenizer.encode(context, add_special_tokens=False, split_special_tokens=True)) \
            if context else []
        ids = [*self._head, *text, *self._user, *audio_part.token_ids, *self._tail]
        if forced:
            ids += self._ids(f"language {forced}{ASR_TEXT}")
        if prefix:  # the transcript's words as plain text (a client's markup stays text)
            ids += self.tokenizer.encode(prefix, add_special_tokens=False, split_special_tokens=True)
        return ASRPromptIds(ids, audio_part.mels)

    def audio_prompt(self, audio: np.ndarray) -> ASRPromptIds:
        """``<|audio_start|>``, the audio's placeholders, ``<|audio_end|>``, and its mel frames."""
        mel = self.mel(audio)
        start, pad, end = self._audio
        return ASRPromptIds([start, *[pad] * audio_output_length(mel.shape[1], self.n_window), end], [mel])
