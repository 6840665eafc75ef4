"""What only Pocket TTS's stages exchange: the backbone stage's start (frames, chunks and audio are generic)."""

from __future__ import annotations

import msgspec

from omnistage.families.pocket_tts.prompt import PocketPrompt
from omnistage.ipc.messages import PayloadTypes
from omnistage.sampling_params import SamplingParams


class PocketSpeech(msgspec.Struct, tag="pocket_tts.PocketSpeech"):
    """The utterance and the request's sampling (temperature, seed, max_tokens: frames)."""

    prompt: PocketPrompt
    sampling: SamplingParams


PAYLOADS = PayloadTypes((PocketSpeech,))
