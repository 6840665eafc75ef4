"""The playback-aware chunk planner against a fake clock: a simulated talker and vocoder, no model.

A talker makes one frame every ``talker_rtf * 80 ms``; one vocoder decodes chunks in order, each taking a fixed
call cost plus a cost per decoded frame (left context included). The stream's player starts at its first audio
and pauses when it runs dry (``Playback``), which counts the stalls.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable
from dataclasses import dataclass

import pytest
import torch

from omnistage.engine.frame_chunker import ChunkPlan, FrameChunker
from omnistage.pipeline.chunk_planner import ChunkBounds, PlaybackPlanner, StagePaces, covering_first_frames
from omnistage.pipeline.playback import Playback

FIRST, MAX, CONTEXT = 10, 25, 25
FRAME_S = 0.08  # a 12.5 Hz codec's frame


@dataclass
class Run:
    playback: Playback
    sizes: list[int]  # new frames per chunk
    audio_s: float


def simulate(talker_rtf: float | Callable[[int], float], frames: int = 300, call_s: float = 0.12,
             frame_cost_s: float = 0.012, planned: bool = True, context: int = CONTEXT, first: int = FIRST,
             stage: StagePaces | None = None, input_open: bool = False) -> Run:
    """One stream of ``frames`` frames; ``talker_rtf`` may vary by frame index. The defaults make a 25-frame
    chunk with 25 frames of context take 0.72 s to decode: more than the 0.8 s a first 10-frame chunk holds once
    the talker's 2 s for 25 frames are added."""
    clock = [0.0]
    playback = Playback()
    plan = ChunkPlan(chunk_frames=MAX, left_context=context, first_chunk_frames=first, seamless=True)
    bounds = ChunkBounds(first, MAX, context, FRAME_S)
    planner = PlaybackPlanner(bounds, playback, stage or StagePaces(), clock=lambda: clock[0])
    planner.input_open = input_open
    rtf = talker_rtf if callable(talker_rtf) else lambda _: talker_rtf
    chunker = FrameChunker("s", plan, width=1, sizer=planner if planned else None)
    deliveries: list[tuple[float, int, int]] = []  # (time, chunk index, new frames)
    vocoder_free, sizes = 0.0, []

    def send(jobs: list) -> None:
        nonlocal vocoder_free
        for job in jobs:
            total, new = job.codes.shape[1], job.codes.shape[1] - job.left_context
            planner.chunk_sent(job.chunk_index, clock[0], new, total)
            playback.sent(new * FRAME_S)
            vocoder_free = max(clock[0], vocoder_free) + call_s + frame_cost_s * total
            heapq.heappush(deliveries, (vocoder_free, job.chunk_index, new))
            sizes.append(new)

    def deliver_until(t: float) -> None:
        while deliveries and deliveries[0][0] <= t:
            done, index, new = heapq.heappop(deliveries)
            clock[0] = done
            playback.delivered(done, new * FRAME_S)
            planner.chunk_returned(index, done)

    arrival = 0.0
    for j in range(frames):
        arrival += rtf(j) * FRAME_S
        deliver_until(arrival)
        clock[0] = arrival
        planner.frames_arrived(arrival, 1)
        send(chunker.push(torch.zeros(1, 1, dtype=torch.long)))
    send(chunker.finish())
    deliver_until(float("inf"))
    return Run(playback, sizes, sum(sizes) * FRAME_S)


def test_a_talker_at_half_real_time_never_underruns() -> None:
    run = simulate(talker_rtf=0.5)
    assert sum(run.sizes) == 300 and run.sizes[0] == FIRST
    assert run.playback.stalls == 0 and run.playback.stall_s == 0.0
    assert max(run.sizes) == MAX  # once the buffer allows, chunks reach the stage's chunk size
    assert len(run.sizes) < 300 / 10  # far fewer vocoder calls than cutting the first chunk's size every time


def test_fixed_sizes_underrun_where_the_planner_does_not() -> None:
    """The failure the planner exists for: 10 frames, then 25 at once, outrun the 0.8 s the first chunk holds."""
    fixed = simulate(talker_rtf=0.5, planned=False)
    assert fixed.sizes[:3] == [FIRST, MAX, MAX]
    assert fixed.playback.stalls > 0


@pytest.mark.parametrize("talker_rtf", [0.3, 0.5, 0.7])
def test_no_underrun_whenever_the_pipeline_keeps_up(talker_rtf: float) -> None:
    assert simulate(talker_rtf=talker_rtf).playback.stalls == 0


def test_a_talker_slower_than_real_time_stalls_boundedly_and_says_so() -> None:
    """At 1.2x real time no plan can keep a player fed: the stalls are reported, and their total stays near the
    unavoidable deficit (0.2 s per second of audio) instead of piling up per chunk."""
    run = simulate(talker_rtf=1.2)
    assert run.playback.stalls > 0  # reported
    unavoidable = 0.2 * run.audio_s
    assert run.playback.stall_s <= unavoidable + 1.5
    fixed = simulate(talker_rtf=1.2, planned=False)
    assert run.playback.stall_s <= fixed.playback.stall_s + 0.5


def _slowed(base: float, slow: float, start: int, end: int) -> Callable[[int], float]:
    return lambda j: slow if start <= j < end else base


CHEAP = {"call_s": 0.005, "frame_cost_s": 0.002, "context": 0}  # a stateful vocoder: no context, a small call cost


@pytest.mark.parametrize(("base", "slow", "start", "end"), [(0.5, 1.2, 10, 25), (0.6, 1.2, 12, 30), (0.5, 1.4, 10, 20)])
def test_a_talker_slowed_after_the_first_chunk_does_not_stall_the_player(base: float, slow: float, start: int,
                                                                        end: int) -> None:
    """Another stream's prefill slows the talker right after this stream's first chunk: the second chunk is cut
    when waiting longer would starve the player, below the first chunk's size where needed (the vocoder keeps up
    with small chunks), instead of waiting for a first chunk's worth of frames."""
    run = simulate(_slowed(base, slow, start, end), **CHEAP)
    assert run.playback.stalls == 0
    assert min(run.sizes[1:-1]) < FIRST  # it took smaller chunks to get there
    assert len(run.sizes) < 300 / 10  # and grew them again once the talker recovered


def test_far_behind_the_player_pauses_seldom() -> None:
    """At 1.2x real time every plan stalls; chunks of the first one's size make the pauses few (a rebuffer),
    not one per frame, even where one-frame chunks would be cheap."""
    run = simulate(talker_rtf=1.2, **CHEAP)
    assert 0 < run.playback.stalls <= 10
    assert run.playback.stall_s <= 0.2 * run.audio_s + 1.5


def _written(burst: int, gap_s: float, fast: float) -> Callable[[int], float]:
    """A talker fed text as it is written: ``burst`` frames at ``fast`` x real time, then it starves ``gap_s`` for
    the writer's next words."""
    return lambda j: gap_s / FRAME_S if j % burst == burst - 1 else fast


@pytest.mark.parametrize(("burst", "gap_s"), [(20, 1.0), (10, 0.5), (15, 0.8)])
def test_while_the_input_is_open_chunks_do_not_wait_for_frames_that_may_not_come(burst: int, gap_s: float) -> None:
    """An input-bound talker makes frames in bursts and then waits for text: a planner that grows chunks from the
    bursts' pace holds up to a whole chunk of made frames back when the talker starves, and the player runs dry;
    told the input is open, it waits for no more than a first chunk's worth, and what is made gets played."""
    grown = simulate(_written(burst, gap_s, 0.3), frames=200, first=4, **CHEAP)
    capped = simulate(_written(burst, gap_s, 0.3), frames=200, first=4, input_open=True, **CHEAP)
    assert grown.playback.stall_s > 0.5 and max(grown.sizes) > 4
    assert capped.playback.stall_s < 0.15 and max(capped.sizes[:-1]) == 4


def test_growth_is_back_once_the_input_is_closed() -> None:
    clock = [10.0]
    playback = Playback()
    planner = PlaybackPlanner(ChunkBounds(4, MAX, 0, FRAME_S), playback, StagePaces(), clock=lambda: clock[0])
    for t in (9.0, 9.02, 9.04):
        planner.frames_arrived(t, 1)  # a fast talker
    planner.chunk_sent(0, 9.0, 4, 4)
    planner.chunk_returned(0, 9.01)
    playback.delivered(9.01, 3.0)  # seconds of audio ahead
    planner.input_open = True
    assert planner.size(1, pending=2) == 4
    assert planner.size(1, pending=7) == 6  # what is made goes, however many: no waiting for more
    planner.input_open = False
    assert planner.size(1, pending=2) == MAX


def test_smallest_chunk_follows_what_chunks_cost() -> None:
    """Chunks never get smaller than the vocoder keeps up with: a chunk must hold more audio than (``safety`` of)
    a chunk's measured round trip."""
    clock = [0.0]
    bounds = ChunkBounds(FIRST, MAX, 0, FRAME_S)
    planner = PlaybackPlanner(bounds, Playback(), StagePaces(), clock=lambda: clock[0])
    assert planner.min_frames() == FIRST  # nothing measured: the first chunk's size
    planner.chunk_sent(0, 0.0, FIRST, FIRST)
    planner.chunk_returned(0, 0.3)  # 0.3 s a chunk: five frames (0.4 s of audio) are the least that keep up
    assert planner.min_frames() == math.ceil(0.3 / (bounds.safety * FRAME_S)) == 5
    cheap = PlaybackPlanner(bounds, Playback(), planner.stage, clock=lambda: clock[0])
    assert cheap.min_frames() == 5  # a new stream starts from what the pipeline measured
    for i in range(30):
        cheap.chunk_sent(i, float(i), 2, 2)
        cheap.chunk_returned(i, i + 0.01)
    assert cheap.min_frames() == 1
    slow = PlaybackPlanner(bounds, Playback(), StagePaces(), clock=lambda: clock[0])
    slow.chunk_sent(0, 0.0, FIRST, FIRST)
    slow.chunk_returned(0, 5.0)
    assert slow.min_frames() == MAX  # a call that costs more than a first chunk's audio: larger ones, up to MAX


def test_behind_a_playing_player_what_is_ready_goes_now_and_a_dry_one_rebuffers() -> None:
    """Nearly out of audio and too late to wait for more frames: while the player still plays, what is ready goes
    now, however little (the sooner it arrives, the shorter the pause); once it ran dry, a first-size chunk (few,
    whole pauses)."""
    clock = [10.0]
    playback = Playback()
    planner = PlaybackPlanner(ChunkBounds(FIRST, MAX, 0, FRAME_S), playback, StagePaces(), clock=lambda: clock[0])
    for t in (9.0, 9.1, 9.2):
        planner.frames_arrived(t, 1)  # 0.1 s a frame: a slowed talker
    planner.chunk_sent(0, 9.0, FIRST, FIRST)
    planner.chunk_returned(0, 9.02)  # a cheap vocoder: 2 ms a frame, any chunk size keeps up
    assert planner.min_frames() == 1
    playback.delivered(9.02, 1.08)  # the player runs dry at 10.1
    clock[0] = 10.05  # 50 ms of audio left: behind, and five frames are ready
    # Cut now, all five in one call (the chunker cuts once more frames than this are pending; 1 would make five
    # one-frame chunks).
    assert planner.size(1, pending=6) == 5
    clock[0] = 10.3  # it ran dry
    assert planner.size(1, pending=6) == FIRST


def test_behind_only_frames_whose_look_ahead_exists_are_ready() -> None:
    """A decoder of overlapping windows reads ``lookahead`` frames past a chunk's new ones: behind, what goes now is
    what the chunker can cut now (the frames whose look-ahead exists), not what would wait for more frames."""
    clock = [10.0]
    playback = Playback()
    bounds = ChunkBounds(FIRST, MAX, 0, FRAME_S, lookahead=3)
    planner = PlaybackPlanner(bounds, playback, StagePaces(), clock=lambda: clock[0])
    for t in (9.0, 9.1, 9.2):
        planner.frames_arrived(t, 1)
    planner.chunk_sent(0, 9.0, FIRST, FIRST)
    planner.chunk_returned(0, 9.02)
    playback.delivered(9.02, 1.08)
    clock[0] = 10.05
    assert planner.size(1, pending=6) == 2  # 6 pending: 3 are look-ahead, 1 stays back for the final chunk
    assert planner.size(1, pending=9) == 5
    with pytest.raises(ValueError):
        ChunkBounds(FIRST, MAX, 0, FRAME_S, lookahead=-1)


def test_a_slower_newest_frame_sets_the_talker_pace_at_once() -> None:
    planner = PlaybackPlanner(ChunkBounds(FIRST, MAX, 0, FRAME_S), Playback(), StagePaces())
    for t in (0.0, 0.04, 0.08, 0.12):
        planner.frames_arrived(t, 1)
    assert planner.paces()[0] == pytest.approx(0.04)
    planner.frames_arrived(0.32, 1)  # other streams' prefills: the talker slowed to 0.2 s a frame
    assert planner.talker.value < 0.1  # the average follows slowly
    assert planner.paces()[0] == pytest.approx(0.2)  # sizing plans for the pace now
    planner.frames_arrived(0.36, 1)  # faster again: the average, not the one fast frame
    assert planner.paces()[0] == pytest.approx(planner.talker.value)


def test_a_first_chunk_that_covers_the_second_keeps_a_loaded_pipeline_from_running_dry() -> None:
    """A vocoder dear per frame (0.02 s a decoded frame, context included) behind a talker at 0.7x real time: the
    first chunk's 0.8 s runs out before the second is back, and the player pauses again while it catches up. A
    first chunk sized from what an earlier stream measured covers the second one's making."""
    load = {"talker_rtf": 0.7, "frame_cost_s": 0.02}
    measured = StagePaces()
    simulate(**load, stage=measured)
    first = covering_first_frames(ChunkBounds(FIRST, MAX, CONTEXT, FRAME_S), measured)
    assert FIRST < first <= MAX
    assert simulate(**load).playback.stalls > 0
    assert simulate(**load, first=first).playback.stalls == 0


def test_the_covering_first_chunk_waits_for_measurements_and_stays_within_bounds() -> None:
    bounds = ChunkBounds(FIRST, MAX, CONTEXT, FRAME_S)
    assert covering_first_frames(bounds, StagePaces()) == FIRST  # nothing measured: the stage's first chunk
    quick = StagePaces()
    for pace, sample in ((quick.talker_frame_s, 0.01), (quick.vocoder_frame_s, 0.001), (quick.vocoder_chunk_s, 0.02)):
        pace.add(sample)
    assert covering_first_frames(bounds, quick) == FIRST  # a pipeline well ahead: no larger than configured
    slow = StagePaces()
    for pace, sample in ((slow.talker_frame_s, 0.06), (slow.vocoder_frame_s, 0.05), (slow.vocoder_chunk_s, 2.0)):
        pace.add(sample)
    assert covering_first_frames(bounds, slow) == MAX  # none covers it, the talker ahead of real time: the largest
    # None covers it and the talker is slower than real time: the player runs dry whatever the first chunk, so the
    # first audio is not held back to the largest (Pocket TTS at c=4 on a loaded machine heard it at the end).
    behind = StagePaces()
    for pace, sample in ((behind.talker_frame_s, 2.0), (behind.vocoder_frame_s, 0.05), (behind.vocoder_chunk_s, 2.0)):
        pace.add(sample)
    assert covering_first_frames(bounds, behind) == FIRST


def test_bounds_are_validated() -> None:
    with pytest.raises(ValueError):
        ChunkBounds(0, 25, 25, FRAME_S)
    with pytest.raises(ValueError):
        ChunkBounds(10, 25, 25, FRAME_S, safety=0.0)
