"""What only Qwen2.5-Omni's stages exchange (the generic tokens, frames, chunks and audio aside).

Thinker → talker (through :class:`omnistage.families.qwen2_5_omni.edges.ThinkerToTalker`): the thinker sends a
capturing request's new hidden rows (:class:`ReplyHidden`) before each of its token outputs; the edge starts the
talker (:class:`TalkerStart`) once the first reply token's own row exists and feeds it the rest
(:class:`ReplyFeed`). Talker → token2wav is the generic codec edge (its frames, chunk jobs and audio chunks).
"""

from __future__ import annotations

import msgspec
import torch

from omnistage.ipc.messages import PayloadTypes
from omnistage.models.qwen2_5_omni.inputs import OmniInputs
from omnistage.sampling_params import SamplingParams


class ThinkerPrompt(msgspec.Struct, tag="qwen2_5_omni.ThinkerPrompt"):
    """The thinker's start: the processed prompt (placeholders expanded), its encoder inputs and sampling.
    ``capture_hidden``: a talker will speak the reply, so every row's last-layer state is sent on."""

    token_ids: list[int]
    sampling: SamplingParams
    mm: OmniInputs = msgspec.field(default_factory=OmniInputs)
    capture_hidden: bool = False


class ReplyHidden(msgspec.Struct, tag="qwen2_5_omni.ReplyHidden"):
    """Last-layer (normed) states ``[k, H]`` of the rows the thinker computed since its previous output (the
    prompt's rows first, then one per fed reply token), sent just before a token output."""

    rows: torch.Tensor


class TalkerStart(msgspec.Struct, tag="qwen2_5_omni.TalkerStart"):
    """The talker's start: the prompt's ids and layout (encoder grids only), its rows' states ``[P, H]``, the
    first reply token and its state ``[H]``, the voice and the talker's sampling."""

    token_ids: list[int]
    layout: OmniInputs
    prompt_hidden: torch.Tensor
    first_token: int
    first_hidden: torch.Tensor
    voice: str
    sampling: SamplingParams


class ReplyFeed(msgspec.Struct, tag="qwen2_5_omni.ReplyFeed"):
    """More fed reply tokens with their states ``[k, H]`` (None when k = 0); ``finished`` once the thinker is done
    (the talker then reads text-eos, then text-pad)."""

    token_ids: list[int]
    hidden: torch.Tensor | None = None
    finished: bool = False


PAYLOADS = PayloadTypes((ThinkerPrompt, ReplyHidden, TalkerStart, ReplyFeed))
