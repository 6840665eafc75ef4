"""CSM's speech API side: ``voice`` is a speaker id, or a voice cloned from reference audio with its transcript
(a context segment the request continues); the request's prompt and its frame bound."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import torch

from omnistage.core import Prompt
from omnistage.families.csm.config import CsmConfig
from omnistage.families.csm.prompt import CsmPrompt, CsmTokenizer, Segment
from omnistage.families.csm.voices import CsmVoice, read_voice, write_voice
from omnistage.families.speech import SpeechAsk, SpeechFrontEnd

SPEAKERS = ("0", "1")  # the conversation's two sides, as Sesame's examples name them
MIN_VOICE_S = 0.2  # under a few frames there is no voice to clone


class CsmSpeechFrontEnd(SpeechFrontEnd):
    speakers = SPEAKERS
    clones_voices = True

    def __init__(self, folder: Path, cfg: CsmConfig) -> None:
        self.folder, self.cfg = folder, cfg
        self.tokenizer = CsmTokenizer(folder, cfg)
        self._encoder = None  # the codec's encoding half, loaded on the first clone
        self._lock = threading.Lock()

    def prompt(self, ask: SpeechAsk) -> CsmPrompt:
        if isinstance(ask.clone, CsmVoice):
            return self.tokenizer.prompt(ask.text, ask.clone.speaker, ask.clone.segments)
        speaker = int(ask.voice) if ask.voice in SPEAKERS else 0
        return self.tokenizer.prompt(ask.text, speaker)

    def max_frames(self, prompt: Prompt, room: int) -> int:
        if not isinstance(prompt, CsmPrompt):
            raise TypeError(f"a CSM request carries a CsmPrompt, not {type(prompt).__name__}")
        return max(1, min(room - prompt.num_tokens, prompt.max_frames(self.cfg)))

    def clone_voice(self, samples: np.ndarray, sample_rate: int, transcript: str | None) -> CsmVoice:
        from omnistage.audio.decode import resample
        from omnistage.families.csm.checkpoint import load_codec

        if not transcript or not transcript.strip():
            raise ValueError("CSM speaks after a context turn: give the reference audio's transcript (ref_text)")
        rate = self.cfg.codec.sampling_rate
        wave = resample(np.asarray(samples, dtype=np.float32), sample_rate, rate)
        if len(wave) < MIN_VOICE_S * rate:
            raise ValueError(f"the reference audio is too short to clone a voice (at least {MIN_VOICE_S} s)")
        with self._lock:  # one load, and the encoder is not shared between threads mid-call
            if self._encoder is None:
                self._encoder = load_codec(self.folder, self.cfg, decoder=False)
            codes = self._encoder.encode(torch.from_numpy(wave)[None], num_quantizers=self.cfg.num_codebooks)
        return CsmVoice((Segment(0, " ".join(transcript.split()), codes[0].T.contiguous()),))

    def save_voice(self, voice: object, folder: Path) -> None:
        if not isinstance(voice, CsmVoice):
            raise TypeError(f"expected a CsmVoice, got {type(voice).__name__}")
        write_voice(voice, folder)

    def load_voice(self, folder: Path) -> CsmVoice:
        return read_voice(folder, self.cfg.num_codebooks)
