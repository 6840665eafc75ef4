"""What Qwen3-ASR's one stage takes: the prompt ids, each audio's valid mel frames, and the sampling."""

from __future__ import annotations

import msgspec
import torch

from omnistage.ipc.messages import PayloadTypes
from omnistage.sampling_params import SamplingParams


class RecogniserPrompt(msgspec.Struct, tag="qwen3_asr.RecogniserPrompt"):
    token_ids: list[int]
    mels: list[torch.Tensor]
    sampling: SamplingParams


PAYLOADS = PayloadTypes((RecogniserPrompt,))
