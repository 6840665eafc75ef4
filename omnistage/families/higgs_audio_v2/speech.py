"""Higgs Audio v2's speech front end: text in Llama 3's turns; the voice the model's own (``default``), or one
cloned from reference audio: its codes from the tokenizer's encoder and its transcript in the prompt's earlier
turn (``ref_audio``/``ref_text`` on a request, or a voice registered with the voices endpoint, stored as
``voice.safetensors`` + ``voice.json``). ``instructions`` become the system turn's scene description."""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from omnistage.core import Prompt
from omnistage.families.higgs_audio_v2.config import HiggsCheckpoint
from omnistage.families.higgs_audio_v2.prompt import HiggsPrompt, HiggsTokenizer
from omnistage.families.speech import SpeechAsk, SpeechFrontEnd

DEFAULT_VOICE = "default"  # the model's own voice: no reference in the prompt
MIN_VOICE_S = 0.2  # under a few frames there is no voice to clone
TENSORS, META = "voice.safetensors", "voice.json"


@dataclass(frozen=True)
class HiggsVoice:
    codes: torch.Tensor  # [G, n] the reference audio's codes
    transcript: str = ""


class HiggsSpeechFrontEnd(SpeechFrontEnd):
    speakers = (DEFAULT_VOICE,)
    clones_voices = True

    def __init__(self, folder: Path, ckpt: HiggsCheckpoint) -> None:
        self.folder, self.ckpt = folder, ckpt
        self.tokenizer = HiggsTokenizer(folder, ckpt.model)
        self._encoder = None  # the codec with its encoder, loaded on the first clone
        self._lock = threading.Lock()

    def prompt(self, ask: SpeechAsk) -> HiggsPrompt:
        voice = ask.clone if isinstance(ask.clone, HiggsVoice) else None
        return self.tokenizer.prompt(ask.text, None if voice is None else voice.codes,
                                     "" if voice is None else voice.transcript, ask.instructions)

    def max_frames(self, prompt: Prompt, room: int) -> int:
        if not isinstance(prompt, HiggsPrompt):
            raise TypeError(f"a Higgs Audio request carries a HiggsPrompt, not {type(prompt).__name__}")
        left = room - len(prompt.ids)
        if left < 1:
            raise ValueError(f"the prompt's {len(prompt.ids)} tokens leave no room in the {room}-token context")
        return max(1, min(left, prompt.max_frames()))

    def clone_voice(self, samples: np.ndarray, sample_rate: int, transcript: str | None) -> HiggsVoice:
        from omnistage.audio.decode import resample
        from omnistage.families.higgs_audio_v2.checkpoint import load_codec

        rate = self.ckpt.codec.sample_rate
        wave = resample(np.asarray(samples, dtype=np.float32), sample_rate, rate)
        if len(wave) < MIN_VOICE_S * rate:
            raise ValueError(f"the reference audio is too short to clone a voice (at least {MIN_VOICE_S} s)")
        with self._lock:  # one load, and the encoder is not shared between threads mid-call
            if self._encoder is None:
                self._encoder = load_codec(self.folder, encoder=True)
            codes = self._encoder.encode(torch.from_numpy(wave))
        return HiggsVoice(codes.long().cpu(), " ".join((transcript or "").split()))

    def save_voice(self, voice: object, folder: Path) -> None:
        if not isinstance(voice, HiggsVoice):
            raise TypeError(f"expected a HiggsVoice, got {type(voice).__name__}")
        save_file({"codes": voice.codes.contiguous()}, str(folder / TENSORS))
        (folder / META).write_text(json.dumps({"transcript": voice.transcript}))

    def load_voice(self, folder: Path) -> HiggsVoice:
        codes = load_file(str(folder / TENSORS))["codes"]
        if codes.dim() != 2 or codes.shape[0] != self.ckpt.model.num_codebooks:
            raise ValueError(f"{folder}: a voice's codes are [{self.ckpt.model.num_codebooks}, n]")
        return HiggsVoice(codes.long(), json.loads((folder / META).read_text()).get("transcript", ""))
