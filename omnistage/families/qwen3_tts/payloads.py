"""What only Qwen3-TTS's stages exchange: the talker's start (the generic frames, chunks and audio aside).

The utterance travels as the model's own :class:`PromptSpec` (a dataclass msgspec encodes as it is, its
cloned voice's tensors out of band): it is also the request's prompt in the front end.
"""

from __future__ import annotations

import msgspec

from omnistage.ipc.messages import PayloadTypes
from omnistage.models.qwen3_tts.prompt import PromptSpec
from omnistage.sampling_params import SamplingParams


class TalkerSpeech(msgspec.Struct, tag="qwen3_tts.TalkerSpeech"):
    """The talker's start: the utterance and the talker's sampling."""

    prompt: PromptSpec
    sampling: SamplingParams


PAYLOADS = PayloadTypes((TalkerSpeech,))
