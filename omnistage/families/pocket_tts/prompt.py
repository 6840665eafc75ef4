"""A Pocket TTS utterance as ids: ``[voice BOS] [voice placeholders] text [audio BOS]``.

The text is prepared as the reference's runtime prepares it (whitespace collapsed, first letter capitalised, a
final period added when the text ends without punctuation) and tokenised by the checkpoint's tokenizer. A cloned
voice's latents fill its placeholders; a checkpoint without a voice gets the voice BOS alone.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from omnistage.families.pocket_tts.config import PocketConfig
from omnistage.families.pocket_tts.generate import frame_budget, frames_after_eos


@dataclass(frozen=True)
class PocketPrompt:
    """Everything one utterance depends on; travels to the backbone stage as it is."""

    text_ids: list[int]
    voice: torch.Tensor | None = None  # [n, latent] in the tokenizer's space, or None
    frames_after_eos: int = 2

    @property
    def num_tokens(self) -> int:
        return len(self.text_ids)

    def input_ids(self, cfg: PocketConfig) -> torch.Tensor:
        voice = [cfg.audio_prompt_token_id] * (0 if self.voice is None else self.voice.shape[0])
        return torch.tensor([cfg.audio_prompt_bos_token_id, *voice, *self.text_ids, cfg.audio_bos_token_id])

    def max_frames(self, cfg: PocketConfig) -> int:
        return frame_budget(len(self.text_ids), cfg.frame_rate)


def prepare_text(text: str) -> str:
    text = " ".join(text.split())
    if not text:
        raise ValueError("input must hold some text to speak")
    text = text[0].upper() + text[1:]
    return text if not text[-1].isalnum() else f"{text}."


class PocketTokenizer:
    """The checkpoint's ``tokenizer.json``; ids must stay below the audio placeholders."""

    def __init__(self, folder: str | Path, cfg: PocketConfig) -> None:
        from tokenizers import Tokenizer

        self.tokenizer = Tokenizer.from_file(str(Path(folder) / "tokenizer.json"))
        self.limit = min(cfg.audio_prompt_token_id, cfg.audio_latent_token_id, cfg.audio_prompt_bos_token_id,
                         cfg.audio_bos_token_id)

    def prompt(self, text: str, voice: torch.Tensor | None = None) -> PocketPrompt:
        prepared = prepare_text(text)
        ids = self.tokenizer.encode(prepared, add_special_tokens=False).ids
        if any(i >= self.limit for i in ids):
            raise ValueError("the text holds a token reserved for the audio positions")
        return PocketPrompt(ids, voice, frames_after_eos(prepared))
