"""Pocket TTS's speech front end: text tokenised, the voice a registered clone or none (the checkpoint's
unconditioned voice). Cloning encodes reference audio with the codec's encoder, which this package does not
load yet: registering a voice is refused with a clear message (see docs/architecture.md)."""

from __future__ import annotations

from pathlib import Path

from omnistage.core import Prompt
from omnistage.families.pocket_tts.config import PocketCheckpoint
from omnistage.families.pocket_tts.prompt import PocketPrompt, PocketTokenizer
from omnistage.families.speech import SpeechAsk, SpeechFrontEnd


class PocketSpeechFrontEnd(SpeechFrontEnd):
    def __init__(self, folder: Path, ckpt: PocketCheckpoint) -> None:
        self.ckpt = ckpt
        self.tokenizer = PocketTokenizer(folder, ckpt.model)

    def prompt(self, ask: SpeechAsk) -> PocketPrompt:
        return self.tokenizer.prompt(ask.text)

    def max_frames(self, prompt: Prompt, room: int) -> int:
        if not isinstance(prompt, PocketPrompt):
            raise TypeError(f"a Pocket TTS request carries a PocketPrompt, not {type(prompt).__name__}")
        return max(1, min(room, prompt.max_frames(self.ckpt.model)))
