"""Playback-aware chunking: each code2wav chunk as large as the stream's player allows.

A small chunk starts audio sooner, a large one costs less per frame (each vocoder call has a fixed cost, and a
configured left context is re-decoded with every chunk; the presets' stateful vocoders need none). Which is right
changes during a stream: the first chunk must be small (time to first audio); after it, the player holds what was
delivered, and the next chunk may grow as long as it is decoded and back before the player runs dry. Fixed sizes
get this wrong at realistic widths: a 10-frame first chunk of a 12.5 Hz codec holds 0.8 s of audio, and making and
decoding a 25-frame second chunk can take longer than that.

So the planner decides, each time talker frames arrive, how many frames the next chunk takes, from
- the player's state (:class:`Playback`: audio delivered minus wall time since it started, plus audio in flight),
- the stream's measured paces: wall seconds per talker frame (frame arrivals) and code2wav seconds per decoded
  frame, context included (chunk send → audio back, queueing included); a stream without its own measurements
  yet uses the pipeline's (:class:`StagePaces`), and before anything is measured, conservative defaults.
Waiting for ``k`` more frames and decoding ``m`` new frames (plus ``c`` of context and, for a decoder that is not
causal, ``L`` of look-ahead: the chunk also waits for those) takes ``k * talker + (m + c + L) * vocoder`` seconds;
the chunk is the largest ``m <= max_frames`` that fits a share of the slack. It may be smaller than the first chunk
when the slack shrank since the last cut (the talker slowed: another stream's prefill), down to the smallest chunk
the vocoder keeps up with (from the measured round trip of a chunk); a stream whose player ran dry takes first-
chunk sizes (or that smallest one, when larger), so its pauses are few rather than one per frame.

While the stream's input is still open (text fed as it is written), the talker is input-bound: it stops whenever
the writer is behind, so frames the planner would wait for may not come at the measured pace. A chunk then waits
for no more than a rebuffer's chunk (the first chunk's size, or the smallest the vocoder keeps up with); what is
made reaches the player before the talker may starve. Growth is back once the input is closed.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from omnistage.pipeline.playback import Playback

# Before anything is measured: a talker at half real time, a vocoder at a quarter of real time per frame.
DEFAULT_TALKER_RTF = 0.5
DEFAULT_VOCODER_RTF = 0.25


@dataclass
class Pace:
    """An exponential moving average of seconds per unit, and the newest sample; None until the first sample."""

    alpha: float = 0.3
    value: float | None = None
    latest: float | None = None

    def add(self, sample: float) -> None:
        self.value = sample if self.value is None else self.value + self.alpha * (sample - self.value)
        self.latest = sample


@dataclass
class StagePaces:
    """What every stream measured: the estimate of a stream that has not measured its own yet."""

    talker_frame_s: Pace = field(default_factory=Pace)
    vocoder_frame_s: Pace = field(default_factory=Pace)
    vocoder_chunk_s: Pace = field(default_factory=Pace)


@dataclass(frozen=True)
class ChunkBounds:
    """first_frames: the first chunk (time to first audio); max_frames: never more (``codec_chunk_frames``);
    frame_s: seconds of audio in one frame (the family's codec). A chunk may take ``safety`` of the time until the
    player runs dry, less ``margin_s`` for delivery. lookahead: frames past a chunk's new ones that it waits for and
    decodes (a decoder of overlapping windows)."""

    first_frames: int
    max_frames: int
    left_context: int
    frame_s: float
    safety: float = 0.75
    margin_s: float = 0.05
    lookahead: int = 0

    def __post_init__(self) -> None:
        if self.first_frames < 1 or self.max_frames < 1 or self.left_context < 0 or self.lookahead < 0 \
                or not 0 < self.safety <= 1 or not self.frame_s > 0:
            raise ValueError(f"invalid chunk bounds: {self}")


def covering_first_frames(bounds: ChunkBounds, stage: StagePaces) -> int:
    """The smallest first chunk (at least ``bounds.first_frames``, at most ``max_frames``) whose audio lasts until
    the second chunk can be back, at the pipeline's measured paces: the talker makes the second chunk's new frames
    while the first one decodes and plays, then the vocoder decodes them with their context and look-ahead. The
    second chunk is the smallest the vocoder keeps up with (:meth:`PlaybackPlanner.min_frames`). A first chunk
    below this runs its player dry at once under load: a decoder of windows (large context, slow calls) or a talker
    slowed by many streams. Before anything is measured: ``first_frames``. When no first chunk up to the largest
    covers it: the largest, unless the talker makes frames slower than they play; then the player runs dry whatever
    the first chunk, and a larger one only holds back the first audio (to the end of a short utterance), so
    ``first_frames``, and the planner's rebuffering sizes once the player ran dry."""
    talker, vocoder, call = (stage.talker_frame_s.value, stage.vocoder_frame_s.value, stage.vocoder_chunk_s.value)
    if talker is None or vocoder is None or call is None:
        return bounds.first_frames
    b = bounds
    second = min(max(math.ceil(call / (b.safety * b.frame_s)), 1), b.max_frames)
    most = max(b.max_frames, b.first_frames)
    for first in range(b.first_frames, most + 1):
        lasts = b.safety * first * b.frame_s - b.margin_s + (first + b.lookahead) * vocoder
        needs = second * talker + (second + min(b.left_context, first) + b.lookahead) * vocoder
        if lasts >= needs:
            return first
    return b.first_frames if talker >= b.frame_s else most


class PlaybackPlanner:
    """One stream's chunk sizes (``FrameChunker`` asks :meth:`size`), and the paces it measures."""

    def __init__(self, bounds: ChunkBounds, playback: Playback, stage: StagePaces,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.bounds, self.playback, self.stage, self.clock = bounds, playback, stage, clock
        self.talker, self.vocoder = Pace(), Pace()
        self.chunk_s = Pace()  # wall seconds from sending a chunk to its audio, whatever its size
        self._frames_at: float | None = None
        self._sent: dict[int, tuple[float, int]] = {}  # chunk index -> (sent at, frames decoded incl. context)
        self._cut = 0  # new frames in chunks so far: the next chunk's context is min(left_context, this)
        self.input_open = False  # the talker waits for input still being written (set by the stream's owner)

    # Measurements ---------------------------------------------------------------------------------
    def frames_arrived(self, now: float, count: int) -> None:
        if count <= 0:
            return
        if self._frames_at is not None:
            per_frame = (now - self._frames_at) / count
            self.talker.add(per_frame)
            self.stage.talker_frame_s.add(per_frame)
        self._frames_at = now

    def chunk_sent(self, index: int, now: float, new_frames: int, total_frames: int) -> None:
        self._sent[index] = (now, total_frames)
        self._cut += new_frames

    def chunk_returned(self, index: int, now: float) -> None:
        sent = self._sent.pop(index, None)
        if sent is not None and sent[1] > 0:
            elapsed = now - sent[0]
            per_frame = elapsed / sent[1]
            self.vocoder.add(per_frame)
            self.stage.vocoder_frame_s.add(per_frame)
            self.chunk_s.add(elapsed)
            self.stage.vocoder_chunk_s.add(elapsed)

    def paces(self) -> tuple[float, float]:
        """(talker, vocoder) seconds per frame: this stream's, else the pipeline's, else the defaults. A stream's
        talker pace is the slower of its average and its newest frame: the talker slows at once when other
        streams start (their prefills), and an average that takes frames to follow would plan a chunk for a pace
        that is gone."""
        frame_s = self.bounds.frame_s
        talker = self.talker.value or self.stage.talker_frame_s.value or DEFAULT_TALKER_RTF * frame_s
        if self.talker.latest is not None:
            talker = max(talker, self.talker.latest)
        vocoder = self.vocoder.value or self.stage.vocoder_frame_s.value or DEFAULT_VOCODER_RTF * frame_s
        return talker, vocoder

    def min_frames(self) -> int:
        """The smallest chunk the vocoder keeps up with: one whose audio lasts longer than (``safety`` of) what a
        chunk takes to come back. A chunk smaller than those measured costs no more than they did (a chunk's cost
        grows with its frames), so ``chunk seconds / (safety * frame)`` frames always suffice: one frame where calls are
        cheap, several where each call re-decodes context or queues behind others, more than the first chunk's
        where a call costs more than its audio lasts (a decoder of windows, whose every call runs its context, its
        look-ahead and a fixed cost), up to the largest chunk. Before any chunk came back: the first chunk's
        size."""
        cost = self.chunk_s.value or self.stage.vocoder_chunk_s.value
        if cost is None:
            return self.bounds.first_frames
        return min(max(math.ceil(cost / (self.bounds.safety * self.bounds.frame_s)), 1), self.bounds.max_frames)

    # Sizing ---------------------------------------------------------------------------------------
    def size(self, index: int, pending: int, now: float | None = None) -> int:
        """Frames the chunk ``index`` takes; the chunker cuts it once more than that many are pending. ``now``: the
        clock's time when the caller has it (a talker step's notices are all planned at one time)."""
        b = self.bounds
        if index == 0:
            return b.first_frames
        if now is None:
            now = self.clock()
        slack = b.safety * (self.playback.deadline(now, startup_s=0.0) - now) - b.margin_s
        talker, vocoder = self.paces()
        # Decoded beside the new frames: the context, and the look-ahead the chunk waits for.
        context = min(b.left_context, self._cut) + b.lookahead
        ready = pending - 1 - b.lookahead  # cuttable now: one frame always stays back for the final chunk
        if ready >= 1 and vocoder * (ready + context) > slack:
            # Behind: no time to wait, nor to decode all; as many frames as decode in time go now, or when none
            # would, all that are ready, in one call (splitting them would gain a frame's decode and cost a call
            # each). That while the player still plays: the sooner it arrives, the shorter the pause. Once it ran
            # dry, chunks of the first one's size make its pauses few and whole (a rebuffer), not one per frame, or
            # larger where the vocoder keeps up with none smaller (it would never catch up).
            fit = math.floor(slack / vocoder - context)
            best = fit if fit >= 1 else ready
            dry = self.playback.buffered_s(now) <= 0
            floor = max(b.first_frames, self.min_frames()) if dry else self.min_frames()
        else:
            # Waiting for more frames pays off while they arrive and decode in time; not past that, even below the
            # first chunk's size (a talker slowed after the last cut, by another stream's prefill, leaves less time
            # than planned), down to what the vocoder keeps up with: tinier chunks would spend it on context and
            # per-call cost, and fall behind.
            best = max(ready, math.floor((slack + ready * talker - vocoder * context) / (talker + vocoder)))
            floor = self.min_frames()
            if self.input_open:  # frames waited for may not come at the talker's pace: wait for a rebuffer's worth
                best = min(best, max(ready, b.first_frames, floor))
        return min(max(best, floor), b.max_frames)
