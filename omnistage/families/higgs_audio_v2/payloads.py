"""What only Higgs Audio v2's stages exchange: the generator stage's start (frames, chunks and audio are generic)."""

from __future__ import annotations

import msgspec

from omnistage.families.higgs_audio_v2.prompt import HiggsPrompt
from omnistage.ipc.messages import PayloadTypes
from omnistage.sampling_params import SamplingParams


class HiggsSpeech(msgspec.Struct, tag="higgs_audio_v2.HiggsSpeech"):
    """The utterance and the request's sampling (temperature, top-k/p, seed; ``max_tokens``: frames)."""

    prompt: HiggsPrompt
    sampling: SamplingParams


PAYLOADS = PayloadTypes((HiggsSpeech,))
