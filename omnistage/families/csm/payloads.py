"""What only CSM's stages exchange: the backbone stage's start (frames, chunks and audio are generic)."""

from __future__ import annotations

import msgspec

from omnistage.families.csm.prompt import CsmPrompt
from omnistage.ipc.messages import PayloadTypes
from omnistage.sampling_params import SamplingParams


class CsmSpeech(msgspec.Struct, tag="csm.CsmSpeech"):
    """The utterance and the request's sampling (temperature, top-k/p and seed for every code; max_tokens:
    frames)."""

    prompt: CsmPrompt
    sampling: SamplingParams


PAYLOADS = PayloadTypes((CsmSpeech,))
