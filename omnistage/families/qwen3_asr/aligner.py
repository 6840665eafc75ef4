"""Qwen3-ForcedAligner: each word of a transcript timed against its audio in one forward pass.

The prompt is the audio, then every word followed by two ``<timestamp>`` markers (its start and its end), as
Qwen's ``qwen-asr`` and transformers' ``prepare_forced_aligner_inputs`` lay it out; the head gives each marker row a
class, ``timestamp_segment_time`` (80 ms) apiece. Out-of-order predictions are repaired as the reference repairs
them (transformers' ``_fix_timestamps``: the longest increasing run kept, the rest snapped or interpolated).
Words are split as the reference splits them (CJK characters one by one, other scripts at spaces, punctuation
dropped).
"""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import torch

from omnistage.families.qwen3_asr.config import Qwen3ASRCheckpoint
from omnistage.families.qwen3_asr.model import Qwen3ASR
from omnistage.families.qwen3_asr.prompt import ASRPromptIds, Qwen3ASRPromptProcessor
from omnistage.families.qwen3_asr.stage import whole_prompt_hidden
from omnistage.processing.transcription import WordTime

SEGMENT_MS = 80.0  # transformers' Qwen3ASRProcessor.timestamp_segment_time
MAX_SECONDS = 180.0  # qwen-asr's MAX_FORCE_ALIGN_INPUT_SECONDS: the longest audio it times at once


def split_words(text: str, language: str | None = None) -> list[str]:
    """The transcript's words as the aligner reads them (transformers' splitter; it reads nothing of its object)."""
    from transformers.models.qwen3_asr.processing_qwen3_asr import Qwen3ASRProcessor

    return Qwen3ASRProcessor.split_words_for_alignment(None, text, language)  # type: ignore[arg-type]


class ForcedAligner:
    """A loaded aligner (meets :class:`omnistage.processing.transcription.WordTimer`); :meth:`align` runs in a
    decode-pool job, its forward under a lock (one at a time: a forward is the whole job)."""

    max_seconds = MAX_SECONDS

    def __init__(self, folder: str | Path, device: torch.device | str = "cpu",
                 dtype: torch.dtype = torch.float32) -> None:
        self.ckpt = Qwen3ASRCheckpoint.from_folder(folder)
        if not self.ckpt.aligner:
            raise ValueError(f"{folder} is not a Qwen3 forced aligner (a token-classification checkpoint)")
        self.model = Qwen3ASR.from_checkpoint(folder, device, dtype, ckpt=self.ckpt)
        self.processor = Qwen3ASRPromptProcessor(folder, int(self.ckpt.audio.n_window))
        self.timestamp = int(self.ckpt.hf.timestamp_token_id)
        self._lock = threading.Lock()

    def prompt(self, audio: np.ndarray, words: list[str]) -> ASRPromptIds:
        """The audio's placeholders, then each word's ids and its two markers."""
        base = self.processor.audio_prompt(audio)
        ids = list(base.token_ids)
        for word in words:
            ids += self.processor.tokenizer.encode(word, add_special_tokens=False, split_special_tokens=True)
            ids += [self.timestamp, self.timestamp]
        return ASRPromptIds(ids, base.mels)

    @torch.no_grad()
    def logits(self, prompt: ASRPromptIds) -> torch.Tensor:
        """Class logits ``[L, num_labels]`` of every prompt row."""
        return self.model.score(whole_prompt_hidden(self.model, prompt.token_ids, prompt.mels))

    def align(self, audio: np.ndarray, transcript: str, language: str | None = None) -> list[WordTime]:
        from transformers.models.qwen3_asr.processing_qwen3_asr import _fix_timestamps

        words = split_words(transcript, language)
        if not words:
            return []
        prompt = self.prompt(audio, words)
        with self._lock:
            classes = self.logits(prompt).argmax(-1).cpu()
        marks = classes[torch.tensor(prompt.token_ids) == self.timestamp].float() * SEGMENT_MS
        ms = _fix_timestamps(marks.numpy())
        # A class is a time bin: no word is placed past the audio's end (a bin may start before it and run over).
        last = len(audio) / 16000
        return [WordTime(w, min(round(ms[2 * i] / 1000, 3), last), min(round(ms[2 * i + 1] / 1000, 3), last))
                for i, w in enumerate(words)]


def load_word_timer(folder: str | Path) -> ForcedAligner:
    """The family's ``word_timer`` hook (``serve --aligner``): on the GPU when there is one, in the weights' dtype
    there (fp32 on a CPU)."""
    if torch.cuda.is_available():
        return ForcedAligner(folder, "cuda", torch.bfloat16)
    return ForcedAligner(folder)
