"""What only Qwen3-Omni's stages exchange (the generic tokens, frames, chunks and audio aside)."""

from __future__ import annotations

import msgspec
import torch

from omnistage.engine.request import MultimodalSpan
from omnistage.ipc.messages import PayloadTypes
from omnistage.models.qwen3_omni.inputs import MultimodalInputs, PromptLayout
from omnistage.sampling_params import SamplingParams


class ThinkerPrompt(msgspec.Struct, tag="qwen3_omni.ThinkerPrompt"):
    """The thinker's start: the processed prompt and its sampling. ``capture_hidden``: a talker will need the
    accept-layer hidden states at the prompt's multimodal rows."""

    token_ids: list[int]
    sampling: SamplingParams
    mm: MultimodalInputs = msgspec.field(default_factory=MultimodalInputs)
    capture_hidden: bool = False


class PromptHidden(msgspec.Struct, tag="qwen3_omni.PromptHidden"):
    """The thinker's accept-layer states ``[M, H]`` at the prompt's M multimodal rows (None when M = 0), sent
    once, before its first tokens, for a capturing request; with its multimodal items' spans and content
    digests (the thinker's prefix-cache keys), which key the talker's prefix cache."""

    mm_hidden: torch.Tensor | None = None
    items: tuple[MultimodalSpan, ...] = ()


class TalkerStart(msgspec.Struct, tag="qwen3_omni.TalkerStart"):
    """The talker's start: the thinker's prompt layout, hidden states at multimodal rows, its first token, and
    the thinker's multimodal items (:class:`PromptHidden`)."""

    layout: PromptLayout
    first_token: int
    voice: str
    sampling: SamplingParams
    mm_hidden: torch.Tensor | None = None
    thinker_items: tuple[MultimodalSpan, ...] = ()


class TextFeed(msgspec.Struct, tag="qwen3_omni.TextFeed"):
    """More thinker tokens for a running talker request; ``finished`` once the thinker is done."""

    token_ids: list[int]
    finished: bool = False


PAYLOADS = PayloadTypes((ThinkerPrompt, PromptHidden, TalkerStart, TextFeed))
