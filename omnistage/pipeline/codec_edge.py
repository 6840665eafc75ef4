"""The codec edge of every family: a talker's frames cut into playback-aware chunks for its codec stage.

One request's :class:`CodecEdge` holds its :class:`AudioProgress`: the frame chunker (sizes from the player-aware
planner when the caller plays the audio as it arrives, the stage's full chunk size otherwise), the caller's
player and the measured paces. A family only names the edge (``EdgeModel(make=None)``) and may give a voice
prompt the stream decodes first (:meth:`omnistage.families.base.Family.codec_prime`).
"""

from __future__ import annotations

import time

import torch

from omnistage.config.pipeline import StageSpec, StreamingSpec
from omnistage.engine.frame_chunker import ChunkPlan, FrameChunker
from omnistage.engine.generation_engine import ChunkJob, vocoder_batch_cap
from omnistage.families.base import RequestEdge
from omnistage.ipc.payloads import CodecFrames
from omnistage.pipeline.chunk_planner import ChunkBounds, PlaybackPlanner, StagePaces
from omnistage.pipeline.playback import Playback
from omnistage.pipeline.request_state import AudioProgress


def initial_chunk_frames(streaming: StreamingSpec, requested: int | None, busy: int, capacity: int,
                         head_start: bool = False) -> int:
    """Frames in a request's first codec chunk.

    A small first chunk cuts time to first audio, but its player starts with
    little in hand: under load (other streams' prefills slow the talker, their
    chunks queue at the vocoder) the next chunk may come late. So the first chunk
    grows linearly with the audio requests already in flight, reaching the regular
    chunk size once the codec stage's batch is full. A request may name its own size.
    A request with a head start (it starts before its player does, e.g. a speculative
    reply played from the user's turn's end) gets half the unloaded first chunk at any load:
    the frames made before its player starts cover the next chunk, and a grown chunk
    would make it wait for talker frames its head start does not cover.
    """
    if requested is not None:
        return max(int(requested), 1)
    low, high = streaming.initial_codec_chunk_frames, max(streaming.codec_chunk_frames,
                                                          streaming.initial_codec_chunk_frames)
    if head_start:
        return max(low // 2, 1)
    share = min(busy / max(capacity, 1), 1.0)
    return round(low + (high - low) * share)


def audio_progress(request_id: str, streaming: StreamingSpec, codec: StageSpec, requested_first: int | None,
                   played: bool, busy: int, paces: StagePaces, num_groups: int,
                   prime: torch.Tensor | None = None, head_start: bool = False) -> AudioProgress:
    """A streamed request's chunks follow its player (a small first chunk, then as large as its buffer
    allows); a request consumed whole gets full-size chunks after the first."""
    capacity = vocoder_batch_cap(codec.engine.max_num_seqs, codec.device) * codec.replicas
    first = initial_chunk_frames(streaming, requested_first, busy, capacity, head_start)
    plan = ChunkPlan(chunk_frames=streaming.codec_chunk_frames, left_context=streaming.codec_left_context_frames,
                     first_chunk_frames=first)
    playback = Playback()
    bounds = ChunkBounds(first, streaming.codec_chunk_frames, streaming.codec_left_context_frames)
    planner = PlaybackPlanner(bounds, playback, paces)  # measures every stream; sizes played ones
    chunker = FrameChunker(request_id, plan, num_groups, planner if played else None, prime)
    return AudioProgress(chunker, first, playback, planner)


class CodecEdge(RequestEdge):
    def __init__(self, audio: AudioProgress) -> None:
        self.audio = audio

    def on_output(self, payload: object, finished: bool) -> list[ChunkJob]:
        audio, now = self.audio, time.monotonic()
        frames = payload.frames if isinstance(payload, CodecFrames) else None
        jobs: list[ChunkJob] = []
        if frames is not None and frames.numel():
            audio.planner.frames_arrived(now, frames.shape[0])
            jobs += audio.chunker.push(frames)
        if finished:
            jobs += audio.chunker.finish()
            audio.talker_done = True
        for job in jobs:
            job.deadline = audio.playback.deadline(now)
            audio.chunks_sent += 1
            new_frames = job.codes.shape[1] - job.left_context - job.discard_frames
            audio.playback.sent(new_frames)
            audio.planner.chunk_sent(job.chunk_index, now, new_frames, job.codes.shape[1])
        return jobs
