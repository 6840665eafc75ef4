"""Qwen3-TTS's speech front end: a caller's text and voice validated against the checkpoint and tokenised.

CustomVoice checkpoints take one of their speakers as ``voice`` (and ``instructions`` where the model uses
them), VoiceDesign checkpoints a voice described in ``instructions``; Base checkpoints a voice cloned from a
reference recording (registered through the voices endpoint; the speaker and codec encoders load on first use).
Text still being written is spoken as it comes (:mod:`omnistage.families.qwen3_tts.spoken_text`).
"""

from __future__ import annotations

import threading
from dataclasses import replace
from pathlib import Path

import numpy as np

from omnistage.core import Prompt
from omnistage.families.qwen3_tts.spoken_text import Qwen3TTSSpokenText
from omnistage.families.speech import CloneMode, SpeechAsk, SpeechFrontEnd
from omnistage.models.qwen3_tts.config import Qwen3TTSConfig
from omnistage.models.qwen3_tts.prompt import PromptSpec, VoiceClone
from omnistage.models.qwen3_tts.request import SpeechInput, TextTokenizer, make_voice_clone, prompt_spec

# A bound on frames per text token for a talker that will not stop (12.5 frames a second: 0.64 s a token,
# several times what speech takes), plus a few seconds for short inputs.
FRAMES_PER_TOKEN = 8
EXTRA_FRAMES = 40
# Prompt rows beside the text: role, codec prefix (think/language/speaker), the closing specials.
PROMPT_OVERHEAD_ROWS = 16


class Qwen3TTSSpeech(SpeechFrontEnd):
    def __init__(self, folder: str | Path, config: Qwen3TTSConfig) -> None:
        self.folder, self.config = Path(folder), config
        self.tokenizer = TextTokenizer(folder)
        kind = config.tts_model_type
        self.speakers = tuple(config.talker.speakers) if kind == "custom_voice" else ()
        self.needs_instructions = kind == "voice_design"
        self.clones_voices = config.is_base
        self.takes_text_deltas = True  # the dual-track talker reads its text one row per frame
        self._encoders = None  # VoiceEncoders, loaded on the first registration
        self._lock = threading.Lock()

    def clone_voice(self, samples: np.ndarray, sample_rate: int, transcript: str | None) -> VoiceClone:
        if not self.clones_voices:
            return super().clone_voice(samples, sample_rate, transcript)
        from omnistage.models.qwen3_tts.checkpoint import VoiceEncoders

        with self._lock:  # one load, and the encoders are not shared between threads mid-call
            if self._encoders is None:
                self._encoders = VoiceEncoders.load(self.folder, self.config)
            return make_voice_clone(self._encoders, self.tokenizer, samples, sample_rate, transcript or None)

    def clone_mode(self, transcript: str | None) -> CloneMode:
        # With a transcript the reference's codes prompt the talker; without, its speaker embedding alone.
        return "in_context" if transcript else "x_vector"

    def save_voice(self, voice: object, folder: Path) -> None:
        from omnistage.families.qwen3_tts.voices import save_clone

        if not isinstance(voice, VoiceClone):
            raise TypeError(f"expected a VoiceClone, got {type(voice).__name__}")
        save_clone(voice, folder)

    def load_voice(self, folder: Path) -> VoiceClone:
        from omnistage.families.qwen3_tts.voices import load_clone

        return load_clone(folder)

    def prompt(self, ask: SpeechAsk) -> PromptSpec:
        return prompt_spec(self.config, self.tokenizer, self._input(ask))

    def spoken_text(self, ask: SpeechAsk, room: int) -> Qwen3TTSSpokenText:
        """Streaming mode (one text row per frame) over the ids as they are written; checked now, on a
        placeholder text."""
        spec = prompt_spec(self.config, self.tokenizer, replace(self._input(replace(ask, text=".")),
                                                                non_streaming=False))
        return Qwen3TTSSpokenText(spec, self.tokenizer, self.max_frames, room)

    def _input(self, ask: SpeechAsk) -> SpeechInput:
        if self.clones_voices:
            if not isinstance(ask.clone, VoiceClone):
                raise ValueError("this Base checkpoint speaks in a cloned voice: register one with POST "
                                 "/v1/audio/voices and name it in voice")
            return SpeechInput(ask.text, voice_clone=ask.clone, language=ask.language)
        if self.needs_instructions and not (ask.instructions and ask.instructions.strip()):
            raise ValueError("this VoiceDesign checkpoint needs the voice described in instructions")
        speaker = ask.voice if self.speakers else None
        return SpeechInput(ask.text, speaker=speaker, instructions=ask.instructions or None, language=ask.language)

    def max_frames(self, prompt: Prompt, room: int) -> int:
        """The frames' bound from the text's length; while the text is still written, the context's room."""
        rows = prompt.num_tokens + PROMPT_OVERHEAD_ROWS
        if room - rows < 1:
            raise ValueError(f"the input is {prompt.num_tokens} tokens; this model's context is {room}")
        if isinstance(prompt, PromptSpec) and prompt.open_text:
            return room - rows
        return min(room - rows, FRAMES_PER_TOKEN * prompt.num_tokens + EXTRA_FRAMES)
