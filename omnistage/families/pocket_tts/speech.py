"""Pocket TTS's speech front end: text tokenised; the voice one the checkpoint ships (``voice``), or one
cloned from reference audio through the codec's encoder (registered with the voices endpoint, loaded on first
use), its latents filling the prompt's voice positions."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import torch

from omnistage.core import Prompt
from omnistage.families.pocket_tts.config import PocketCheckpoint
from omnistage.families.pocket_tts.prompt import PocketPrompt, PocketTokenizer
from omnistage.families.pocket_tts.voices import (CLONE_FILE, VOICES_FOLDER, PocketVoice, builtin_voice_names,
                                                  read_latents, write_latents)
from omnistage.families.speech import SpeechAsk, SpeechFrontEnd

MIN_VOICE_S = 0.2  # under a few frames there is no voice to clone


class PocketSpeechFrontEnd(SpeechFrontEnd):
    clones_voices = True

    def __init__(self, folder: Path, ckpt: PocketCheckpoint) -> None:
        self.folder, self.ckpt = folder, ckpt
        self.tokenizer = PocketTokenizer(folder, ckpt.model)
        self.speakers = builtin_voice_names(folder)
        self._builtin: dict[str, torch.Tensor] = {}
        self._encoder = None  # VoiceEncoder, loaded on the first registration
        self._lock = threading.Lock()

    def prompt(self, ask: SpeechAsk) -> PocketPrompt:
        if isinstance(ask.clone, PocketVoice):
            voice = ask.clone.latents
        elif ask.voice and ask.voice in self.speakers:
            voice = self._builtin_latents(ask.voice)
        else:
            voice = None  # a checkpoint without voices: the voice BOS alone
        return self.tokenizer.prompt(ask.text, voice)

    def max_frames(self, prompt: Prompt, room: int) -> int:
        if not isinstance(prompt, PocketPrompt):
            raise TypeError(f"a Pocket TTS request carries a PocketPrompt, not {type(prompt).__name__}")
        return max(1, min(room, prompt.max_frames(self.ckpt.model)))

    def clone_voice(self, samples: np.ndarray, sample_rate: int, transcript: str | None) -> PocketVoice:
        from omnistage.audio.decode import resample
        from omnistage.families.pocket_tts.checkpoint import load_voice_encoder

        rate = self.ckpt.codec.sampling_rate
        wave = resample(np.asarray(samples, dtype=np.float32), sample_rate, rate)
        if len(wave) < MIN_VOICE_S * rate:
            raise ValueError(f"the reference audio is too short to clone a voice (at least {MIN_VOICE_S} s)")
        with self._lock:  # one load, and the encoder is not shared between threads mid-call
            if self._encoder is None:
                self._encoder = load_voice_encoder(self.folder, self.ckpt)
            return PocketVoice(self._encoder.encode(torch.from_numpy(wave)))

    def save_voice(self, voice: object, folder: Path) -> None:
        if not isinstance(voice, PocketVoice):
            raise TypeError(f"expected a PocketVoice, got {type(voice).__name__}")
        write_latents(voice.latents, folder / CLONE_FILE)

    def load_voice(self, folder: Path) -> PocketVoice:
        return PocketVoice(read_latents(folder / CLONE_FILE, self.ckpt.model.latent_dim))

    def _builtin_latents(self, name: str) -> torch.Tensor:
        with self._lock:
            if name not in self._builtin:
                path = self.folder / VOICES_FOLDER / f"{name}.safetensors"
                self._builtin[name] = read_latents(path, self.ckpt.model.latent_dim)
            return self._builtin[name]
