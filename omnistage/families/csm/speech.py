"""CSM's speech API side: ``voice`` is a speaker id, or a voice cloned from reference audio with its transcript
(a context segment the request continues); earlier turns of the conversation (each a speaker, its text and its
audio) are context segments too, after a cloned voice's; the request's prompt and its frame bound."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import torch

from omnistage.core import Prompt
from omnistage.families.csm.config import CsmConfig
from omnistage.families.csm.prompt import CsmPrompt, CsmTokenizer, Segment
from omnistage.families.csm.voices import CsmVoice, read_voice, write_voice
from omnistage.families.speech import ContextTurn, SpeechAsk, SpeechFrontEnd

SPEAKERS = ("0", "1")  # the conversation's two sides, as Sesame's examples name them
MIN_VOICE_S = 0.2  # under a few frames there is no voice to clone


class CsmSpeechFrontEnd(SpeechFrontEnd):
    speakers = SPEAKERS
    clones_voices = True
    takes_context = True

    def __init__(self, folder: Path, cfg: CsmConfig) -> None:
        self.folder, self.cfg = folder, cfg
        self.tokenizer = CsmTokenizer(folder, cfg)
        self._encoder = None  # the codec's encoding half, loaded on the first clone
        self._lock = threading.Lock()

    def prompt(self, ask: SpeechAsk) -> CsmPrompt:
        cloned = ask.clone.segments if isinstance(ask.clone, CsmVoice) else ()
        default = ask.clone.speaker if isinstance(ask.clone, CsmVoice) else 0
        speaker = int(ask.voice) if ask.voice in SPEAKERS else default
        turns = tuple(self._segment(turn) for turn in ask.context)
        return self.tokenizer.prompt(ask.text, speaker, cloned + turns)

    def _segment(self, turn: ContextTurn) -> Segment:
        if turn.speaker not in SPEAKERS:
            raise ValueError(f"unknown speaker {turn.speaker!r} in the context; CSM's are {', '.join(SPEAKERS)}")
        text = " ".join(turn.text.split())
        if not text:
            raise ValueError("each context turn needs the text its audio says")
        return Segment(int(turn.speaker), text, self._encode(turn.samples, turn.sample_rate))

    def max_frames(self, prompt: Prompt, room: int) -> int:
        if not isinstance(prompt, CsmPrompt):
            raise TypeError(f"a CSM request carries a CsmPrompt, not {type(prompt).__name__}")
        return max(1, min(room - prompt.num_tokens, prompt.max_frames(self.cfg)))

    def clone_voice(self, samples: np.ndarray, sample_rate: int, transcript: str | None) -> CsmVoice:
        if not transcript or not transcript.strip():
            raise ValueError("CSM speaks after a context turn: give the reference audio's transcript (ref_text)")
        return CsmVoice((Segment(0, " ".join(transcript.split()), self._encode(samples, sample_rate)),))

    def _encode(self, samples: np.ndarray, sample_rate: int) -> torch.Tensor:
        """Mono audio as the codec's frames ``[n, 32]``."""
        from omnistage.audio.decode import resample
        from omnistage.families.csm.checkpoint import load_codec

        rate = self.cfg.codec.sampling_rate
        wave = resample(np.asarray(samples, dtype=np.float32), sample_rate, rate)
        if len(wave) < MIN_VOICE_S * rate:
            raise ValueError(f"a turn's or reference's audio is too short (at least {MIN_VOICE_S} s)")
        with self._lock:  # one load, and the encoder is not shared between threads mid-call
            if self._encoder is None:
                self._encoder = load_codec(self.folder, self.cfg, decoder=False)
            codes = self._encoder.encode(torch.from_numpy(wave)[None], num_quantizers=self.cfg.num_codebooks)
        return codes[0].T.contiguous()

    def save_voice(self, voice: object, folder: Path) -> None:
        if not isinstance(voice, CsmVoice):
            raise TypeError(f"expected a CsmVoice, got {type(voice).__name__}")
        write_voice(voice, folder)

    def load_voice(self, folder: Path) -> CsmVoice:
        return read_voice(folder, self.cfg.num_codebooks)
