"""The playback-aware chunk planner against a fake clock: a simulated talker and vocoder, no model.

A talker makes one frame every ``talker_rtf * 80 ms``; one vocoder decodes chunks in order, each taking a fixed
call cost plus a cost per decoded frame (left context included). The stream's player starts at its first audio
and pauses when it runs dry (``Playback``), which counts the stalls.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

import pytest
import torch

from omnistage.pipeline.chunk_planner import ChunkBounds, PlaybackPlanner, StagePaces
from omnistage.pipeline.playback import FRAME_S, Playback
from omnistage.engine.frame_chunker import ChunkPlan, FrameChunker

FIRST, MAX, CONTEXT = 10, 25, 25


@dataclass
class Run:
    playback: Playback
    sizes: list[int]  # new frames per chunk
    audio_s: float


def simulate(talker_rtf: float, frames: int = 300, call_s: float = 0.12, frame_cost_s: float = 0.012,
             planned: bool = True) -> Run:
    """One stream of ``frames`` frames. The defaults make a 25-frame chunk with 25 frames of context take 0.72 s
    to decode: more than the 0.8 s a first 10-frame chunk holds once the talker's 2 s for 25 frames are added."""
    clock = [0.0]
    playback = Playback()
    plan = ChunkPlan(chunk_frames=MAX, left_context=CONTEXT, first_chunk_frames=FIRST, seamless=True)
    planner = PlaybackPlanner(ChunkBounds(FIRST, MAX, CONTEXT), playback, StagePaces(), clock=lambda: clock[0])
    chunker = FrameChunker("s", plan, num_groups=1, sizer=planner if planned else None)
    deliveries: list[tuple[float, int, int]] = []  # (time, chunk index, new frames)
    vocoder_free, sizes = 0.0, []

    def send(jobs: list) -> None:  # noqa: ANN001
        nonlocal vocoder_free
        for job in jobs:
            total, new = job.codes.shape[1], job.codes.shape[1] - job.left_context
            planner.chunk_sent(job.chunk_index, clock[0], new, total)
            playback.sent(new)
            vocoder_free = max(clock[0], vocoder_free) + call_s + frame_cost_s * total
            heapq.heappush(deliveries, (vocoder_free, job.chunk_index, new))
            sizes.append(new)

    def deliver_until(t: float) -> None:
        while deliveries and deliveries[0][0] <= t:
            done, index, new = heapq.heappop(deliveries)
            clock[0] = done
            playback.delivered(done, new * FRAME_S)
            planner.chunk_returned(index, done)

    for j in range(frames):
        arrival = (j + 1) * talker_rtf * FRAME_S
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


def test_bounds_are_validated() -> None:
    with pytest.raises(ValueError):
        ChunkBounds(0, 25, 25)
    with pytest.raises(ValueError):
        ChunkBounds(10, 25, 25, safety=0.0)
