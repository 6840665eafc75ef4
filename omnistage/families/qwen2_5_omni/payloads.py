"""What only Qwen2.5-Omni's stages exchange (the generic tokens, frames, chunks and audio aside)."""

from __future__ import annotations

import msgspec

from omnistage.engine.sampling_params import SamplingParams
from omnistage.ipc.messages import PayloadTypes
from omnistage.models.qwen2_5_omni.inputs import OmniInputs


class ThinkerPrompt(msgspec.Struct, tag="qwen2_5_omni.ThinkerPrompt"):
    """The thinker's start: the processed prompt (placeholders expanded), its encoder inputs and sampling."""

    token_ids: list[int]
    sampling: SamplingParams
    mm: OmniInputs = msgspec.field(default_factory=OmniInputs)


PAYLOADS = PayloadTypes((ThinkerPrompt,))
