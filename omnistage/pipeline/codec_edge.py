"""The codec edge of every family, as the orchestrator plans it: a talker's frames cut into playback-aware chunks.

The frames never come here. The talker replica cuts them itself and sends each chunk straight to the codec
replica (:mod:`omnistage.pipeline.codec_streams`); the orchestrator opens that stream (:meth:`CodecEdge.opening`:
the codec replica's address, the chunk plan, the family's frame), hears what the talker cut
(:class:`FramesMade` notices, :meth:`CodecEdge.frames_made`) and what reached the caller (:meth:`CodecEdge.heard`),
and answers with small :class:`ChunkOrder`\\ s: how many frames the next chunk takes (the player-aware planner,
from the caller's player and the measured paces) and where the player stands (the codec's deadline order). A
family only names the edge (``EdgeModel(make=None)``) and may give a voice prompt the stream decodes first
(:meth:`omnistage.families.base.Family.codec_prime`); its :class:`AudioSpec` says the frame's duration, width and
delays, and the context its decoder needs. The request's voice and seed go with the stream's first chunk, for a
decoder conditioned per request (a flow-matching vocoder's speaker and noise).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from omnistage.audio_spec import AudioSpec, Latent, Streaming
from omnistage.config.pipeline import StageSpec, StreamingSpec
from omnistage.engine.frame_chunker import ChunkPlan
from omnistage.engine.generation_engine import StreamVoice, vocoder_batch_cap
from omnistage.ipc.messages import ChunkOrder, OpenCodecStream
from omnistage.ipc.payloads import AudioChunk, FramesMade
from omnistage.pipeline.chunk_planner import ChunkBounds, PlaybackPlanner, StagePaces, covering_first_frames
from omnistage.pipeline.playback import Playback


def initial_chunk_frames(streaming: StreamingSpec, requested: int | None, busy: int, capacity: int,
                         head_start: bool = False) -> int:
    """Frames in a request's first codec chunk.

    A small first chunk cuts time to first audio, but its player starts with
    little in hand: under load (other streams' prefills slow the talker, their
    chunks queue at the vocoder) the next chunk may come late. So the first chunk
    grows linearly with the audio requests already in flight, reaching the regular
    chunk size once the codec stage's batch is full. A request may name its own size.
    A request with a head start (it starts before its player does, e.g. a speculative
    reply played from the user's turn's end) gets half the unloaded first chunk here, before
    any pace is measured; once they are, :func:`head_start_frames` sizes it.
    """
    if requested is not None:
        return max(int(requested), 1)
    low, high = streaming.initial_codec_chunk_frames, max(streaming.codec_chunk_frames,
                                                          streaming.initial_codec_chunk_frames)
    if head_start:
        return max(low // 2, 1)
    share = min(busy / max(capacity, 1), 1.0)
    return round(low + (high - low) * share)


def chunk_plan(streaming: StreamingSpec, audio: AudioSpec, first: int) -> ChunkPlan:
    """The stage config's chunk sizes; the context a decoder of overlapping windows needs, at least."""
    left = streaming.codec_left_context_frames
    if audio.streaming is Streaming.OVERLAP:
        left = max(left, audio.past_frames)
    return ChunkPlan(chunk_frames=streaming.codec_chunk_frames, left_context=left, first_chunk_frames=first,
                     lookahead=audio.lookahead_frames)


# The least audio a head start's first chunk gives its player when it is the only stream (3 of Qwen3-Omni's 80 ms
# frames): the paces are averages, and on a loaded CPU a talker step and a codec call (medium, load ~5: ~100 ms)
# outlast what 1-2 frames play; such first chunks were followed by 1-frame chunks and ran c=1 streams dry (7 of 12
# turns, against 1 with 5 frames).
HEAD_START_MIN_S = 0.2


def head_start_frames(bounds: ChunkBounds, busy: int, grown: int, paces: StagePaces) -> int:
    """A head start's first chunk (``bounds.first_frames``: half the unloaded one, which it keeps before any pace is
    measured). semantic_vad's speculative reply has a head start of only ~80 ms (its classifier's first verdict comes
    that much after it starts): its turn ends before its first chunk, so every frame of that chunk is a talker step
    the user waits for.

    * Alone (``busy`` 0): smaller still, down to ``HEAD_START_MIN_S``, where a smaller chunk covers the second
      chunk's return at the measured paces (``covering_first_frames``).
    * Beside other streams: never smaller than half, since their prefills slow the talker at once, which the
      paces do not show yet (3-frame chunks there ran 9 of 48 c=4 streams dry, against 3 with 5 frames); larger
      where the paces say the half does not cover the second chunk, up to ``grown`` (what a reply played at once
      starts with at this load)."""
    half = bounds.first_frames
    if paces.talker_frame_s.value is None or paces.vocoder_frame_s.value is None or paces.vocoder_chunk_s.value is None:
        return half
    if busy:
        return max(half, min(grown, covering_first_frames(bounds, paces)))
    least = min(math.ceil(HEAD_START_MIN_S / bounds.frame_s), half)
    return min(half, covering_first_frames(_first(bounds, least), paces))


def _first(bounds: ChunkBounds, first: int) -> ChunkBounds:
    # Built, not ``dataclasses.replace``d: that walks the fields by reflection, on every request's start.
    return ChunkBounds(first, bounds.max_frames, bounds.left_context, bounds.frame_s, bounds.safety, bounds.margin_s,
                       bounds.lookahead)


@dataclass(frozen=True)
class StreamSetup:
    """What one request's codec edge is built from (the orchestrator's view when the request starts)."""

    source: str  # the stage whose frames feed the codec (the talker)
    target: str  # the codec stage
    audio: AudioSpec
    streaming: StreamingSpec
    codec: StageSpec
    played: bool  # the caller plays the audio as it arrives: later chunks follow its player
    busy: int  # audio streams already in flight
    requested_first: int | None = None
    head_start: bool = False
    prime: torch.Tensor | None = None
    voice: StreamVoice | None = None


class CodecEdge:
    """One request's codec edge: the plan it opened with, its caller's player and the planner measuring its
    paces (and, when the caller plays the audio as it arrives, sizing its chunks)."""

    def __init__(self, setup: StreamSetup, paces: StagePaces) -> None:
        self.setup = setup
        capacity = vocoder_batch_cap(setup.codec.engine, setup.codec.device) * setup.codec.replicas
        first = initial_chunk_frames(setup.streaming, setup.requested_first, setup.busy, capacity, setup.head_start)
        plan = chunk_plan(setup.streaming, setup.audio, first)
        bounds = ChunkBounds(first, setup.streaming.codec_chunk_frames, plan.left_context, setup.audio.frame_s,
                             lookahead=plan.lookahead)
        if setup.requested_first is None:  # a size asked for stands
            first = self._paced_first(bounds, capacity, paces)
            plan = chunk_plan(setup.streaming, setup.audio, first)
            bounds = _first(bounds, first)
        self.initial_chunk_frames, self.plan = first, plan
        self.playback = Playback()
        self.planner = PlaybackPlanner(bounds, self.playback, paces)  # measures every stream; sizes played ones
        self.talker_done = False
        self.chunks_sent = 0
        self.chunks_received = 0
        self.delivered_s = 0.0
        self._pending = 0  # frames the talker holds, not in a chunk yet
        # The newest (index, frames) ordered: chunk 0's size was in the stream's opening, so nothing yet.
        self._ordered: tuple[int, int | None] = (0, None)

    def _paced_first(self, bounds: ChunkBounds, capacity: int, paces: StagePaces) -> int:
        """The first chunk at the measured paces: a head start's (``head_start_frames``), else one covering the
        second chunk's return."""
        if not self.setup.head_start:
            return covering_first_frames(bounds, paces)
        grown = initial_chunk_frames(self.setup.streaming, None, self.setup.busy, capacity)  # played at once
        return head_start_frames(bounds, self.setup.busy, grown, paces)

    @property
    def source(self) -> str:
        return self.setup.source

    @property
    def target(self) -> str:
        return self.setup.target

    @property
    def done(self) -> bool:
        return self.talker_done and self.chunks_received >= self.chunks_sent

    def opening(self, request_id: str, codec_address: str) -> OpenCodecStream:
        audio = self.setup.audio
        return OpenCodecStream(request_id, codec_address, self.plan, self.setup.played, audio.frame_width,
                               audio.frame_s, audio.frame.delays, isinstance(audio.frame, Latent),
                               self.setup.prime, self.setup.voice)

    def frames_made(self, request_id: str, notice: FramesMade, finished: bool, now: float) -> ChunkOrder | None:
        """The talker's notice: paces measured, chunks counted as sent; the next chunk's size when it changed."""
        for cut in notice.cuts:
            self.chunks_sent += 1
            self.playback.sent(cut.new_frames * self.setup.audio.frame_s)
            self.planner.chunk_sent(cut.index, now, cut.new_frames, cut.total_frames)
        self.talker_done = self.talker_done or finished
        return self.frames_noted(request_id, notice.count, notice.pending, now)

    def frames_noted(self, request_id: str, count: int, pending: int, now: float) -> ChunkOrder | None:
        """New frames, ``pending`` of them not in a chunk yet (a plain notice, or what a cut's says besides)."""
        self.planner.frames_arrived(now, count)
        self._pending = pending
        return None if self.talker_done else self._order(request_id, now, player_changed=False)

    def heard(self, request_id: str, chunk: AudioChunk, seconds: float, now: float) -> ChunkOrder | None:
        """A chunk's audio reached the caller: the player and the codec pace move, and the talker hears so."""
        self.chunks_received += 1
        self.delivered_s += seconds
        self.playback.delivered(now, seconds)
        self.planner.chunk_returned(chunk.chunk_index, now)
        return None if self.talker_done else self._order(request_id, now, player_changed=True)

    def _order(self, request_id: str, now: float, player_changed: bool) -> ChunkOrder | None:
        index = self.chunks_sent
        frames = self.planner.size(index, self._pending, now) if self.setup.played and index > 0 else None
        if not player_changed and (index, frames) == self._ordered:
            return None
        self._ordered = (index, frames)
        play_end = self.playback.play_end
        return ChunkOrder(request_id, index, frames, None if play_end is None else play_end - now, self.delivered_s)
