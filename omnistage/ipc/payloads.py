"""The payloads every family's stages share: tokens, codec frames, codec chunks and audio.

The orchestrator understands these (text for the caller, frames to cut into
chunks, audio for the caller); a family adds its own payloads for what only its
stages exchange (:class:`omnistage.families.base.Family`). Each is the domain
type itself: the codec stage's input is the engine's :class:`ChunkJob`.
"""

from __future__ import annotations

import msgspec
import torch

from omnistage.engine.generation_engine import ChunkJob
from omnistage.engine.logprobs import TokenLogprob
from omnistage.ipc.messages import PayloadTypes


class TokenDelta(msgspec.Struct, tag="tokens"):
    """New tokens of an autoregressive stage (text, when the stage's output is the caller's text)."""

    token_ids: list[int]
    num_prompt_tokens: int = 0
    num_cached_tokens: int = 0  # prompt tokens served from the prefix cache (their prefill skipped)
    logprobs: list[TokenLogprob] | None = None  # one per token, when the request asked


class CodecFrames(msgspec.Struct, tag="frames"):
    """Codec frames ``[n, G]`` of a talker (codec EOS frames excluded)."""

    frames: torch.Tensor


class AudioChunk(msgspec.Struct, tag="audio"):
    chunk_index: int
    wav: torch.Tensor  # float32 mono samples at 24 kHz
    is_last: bool = False
    busy_s: float = 0.0  # this chunk's share of the vocoder step that made it (admission measures load)


GENERIC_PAYLOADS = PayloadTypes((TokenDelta, CodecFrames, ChunkJob, AudioChunk))
