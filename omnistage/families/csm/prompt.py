"""A CSM utterance as ids: earlier turns (context segments) and then the text to speak, each in the layout
transformers' CSM chat template writes: ``<|begin_of_text|>[speaker]text<|end_of_text|>``, a context segment's
audio frames after it as ``<|AUDIO|>`` positions and an ``<|audio_eos|>``. The model then speaks the last
segment's text in its speaker's voice, as the context set it."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import torch

from omnistage.families.csm.config import CsmConfig

SECONDS_PER_TOKEN, SPARE_SECONDS = 0.5, 3.0  # a frame bound for a model that has not stopped: generous speech


@dataclass(frozen=True)
class Segment:
    """One earlier turn: who spoke (0, 1...), what they said, and its audio as codec frames ``[n, 32]``."""

    speaker: int
    text: str
    codes: torch.Tensor


@dataclass(frozen=True)
class CsmPrompt:
    """Everything one utterance depends on; travels to the backbone stage as it is."""

    input_ids: list[int]
    context: torch.Tensor | None  # [n, 32]: every context segment's frames, in order
    text_tokens: int  # of the text to speak

    @property
    def num_tokens(self) -> int:
        return len(self.input_ids)

    def max_frames(self, cfg: CsmConfig) -> int:
        room = cfg.max_position_embeddings - len(self.input_ids)
        return max(1, min(room, math.ceil((self.text_tokens * SECONDS_PER_TOKEN + SPARE_SECONDS) * cfg.frame_rate)))


class CsmTokenizer:
    """The checkpoint's ``tokenizer.json``; the special ids are the config's."""

    def __init__(self, folder: str | Path, cfg: CsmConfig) -> None:
        from tokenizers import Tokenizer

        self.tokenizer = Tokenizer.from_file(str(Path(folder) / "tokenizer.json"))
        self.cfg = cfg
        self.specials = {cfg.bos_token_id, cfg.eos_token_id, cfg.audio_token_id, cfg.audio_eos_token_id}

    def turn(self, speaker: int, text: str) -> list[int]:
        ids = self.tokenizer.encode(f"[{speaker}]{text}", add_special_tokens=False).ids
        if self.specials.intersection(ids):
            raise ValueError("the text holds a token reserved for the prompt's markers")
        return [self.cfg.bos_token_id, *ids, self.cfg.eos_token_id]

    def prompt(self, text: str, speaker: int = 0, context: tuple[Segment, ...] = ()) -> CsmPrompt:
        text = " ".join(text.split())
        if not text:
            raise ValueError("input must hold some text to speak")
        ids: list[int] = []
        for segment in context:
            frames = segment.codes.shape[0]
            ids += [*self.turn(segment.speaker, segment.text), *[self.cfg.audio_token_id] * frames,
                    self.cfg.audio_eos_token_id]
        last = self.turn(speaker, text)
        if len(ids) + len(last) >= self.cfg.max_position_embeddings:
            raise ValueError(f"the context and text take {len(ids) + len(last)} positions; the model has "
                             f"{self.cfg.max_position_embeddings}")
        codes = torch.cat([s.codes for s in context]).long() if context else None
        return CsmPrompt(ids + last, codes, len(last) - 2)
