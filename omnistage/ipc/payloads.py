"""The payloads every family's stages share: tokens, codec frames, codec chunks and audio.

The orchestrator understands these (text for the caller, frames a family's own edge turns into its codec's
input, what a talker cut for its codec, audio for the caller); a family adds its own payloads for what only its
stages exchange (:class:`omnistage.families.base.Family`). Each is the domain type itself: the codec stage's
input is the engine's :class:`ChunkJob`, which a talker replica sends its codec replica directly.
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
    """Codec frames ``[n, W]`` of a talker (codec EOS frames excluded)."""

    frames: torch.Tensor


class ChunkCut(msgspec.Struct, array_like=True):
    """A chunk a talker replica cut and sent to its codec replica: ``new_frames`` of audio, ``total_frames``
    decoded (context and look-ahead included)."""

    index: int
    new_frames: int
    total_frames: int
    is_last: bool = False


class FramesMade(msgspec.Struct, tag="frames.made"):
    """What a talker did with a request's frames on a stream it cuts itself (:class:`OpenCodecStream`): ``count``
    new frames this step, ``pending`` not in a chunk yet, and the chunks it cut. The orchestrator plans and
    gates from it; the frames themselves went straight to the codec replica."""

    count: int
    pending: int
    cuts: list[ChunkCut] = msgspec.field(default_factory=list)


class AudioChunk(msgspec.Struct, tag="audio"):
    chunk_index: int
    wav: torch.Tensor  # float32 mono samples at the family's output rate (``AudioSpec.sample_rate``)
    is_last: bool = False
    busy_s: float = 0.0  # this chunk's share of the vocoder step that made it (admission measures load)


GENERIC_PAYLOADS = PayloadTypes((TokenDelta, CodecFrames, FramesMade, ChunkJob, AudioChunk))
