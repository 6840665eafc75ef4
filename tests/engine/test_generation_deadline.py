"""Code2wav's playback-deadline policy: the stream about to run dry is decoded first."""

from __future__ import annotations

import random

import pytest
import torch

from omnistage.engine.generation_engine import ChunkJob, GenerationEngineCore
from omnistage.pipeline.playback import Playback
from omnistage.runner.generation_runner import GenerationRunner
from omnistage.tools.bench.metrics import StreamRecord


class _Vocoder:
    def decode_chunk(self, codes: torch.Tensor, left_context: int) -> torch.Tensor:
        return codes[:, 0, left_context:].float()


def _job(rid: str, index: int, slack_s: float) -> ChunkJob:
    return ChunkJob(rid, index, torch.zeros(2, 4, dtype=torch.long), 0, slack_s=slack_s)


def _order(policy: str) -> list[str]:
    core = GenerationEngineCore(GenerationRunner(_Vocoder()), max_batch=1, policy=policy)
    for rid, deadline in (("a", 30.0), ("b", 10.0), ("c", 20.0)):
        core.add_job(_job(rid, 0, deadline))
    return [o.request_id for o in core.run_until_done()]


def test_deadline_serves_least_buffered_stream_first_fifo_keeps_arrival() -> None:
    assert _order("fifo") == ["a", "b", "c"]
    assert _order("deadline") == ["b", "c", "a"]


def test_deadline_keeps_each_streams_chunks_in_order() -> None:
    core = GenerationEngineCore(GenerationRunner(_Vocoder()), max_batch=1, policy="deadline")
    core.add_job(_job("a", 0, 5.0))
    core.add_job(_job("a", 1, 1.0))  # an earlier deadline cannot overtake its own stream's chunk 0
    core.add_job(_job("b", 0, 3.0))
    assert [(o.request_id, o.chunk_index) for o in core.run_until_done()] == [("b", 0), ("a", 0), ("a", 1)]


def test_unknown_policy_is_rejected() -> None:
    with pytest.raises(ValueError):
        GenerationEngineCore(GenerationRunner(_Vocoder()), policy="lifo")


def test_playback_deadline_is_when_the_player_runs_dry() -> None:
    progress = Playback()
    assert progress.deadline(now=100.0) == 101.0  # not started: a second of start-up slack
    progress.sent(2.0)  # 25 frames on the way
    assert progress.deadline(now=100.0) == pytest.approx(103.0)
    progress.delivered(50.0, 2.0)  # it arrives at t=50: plays until 52, nothing left in flight
    assert progress.play_end == pytest.approx(52.0) and progress.in_flight_s == pytest.approx(0.0)
    assert progress.deadline(now=51.0) == pytest.approx(52.0)
    progress.sent(0.8)
    assert progress.deadline(now=51.0) == pytest.approx(52.8)


def test_a_player_that_ran_dry_resumes_when_audio_arrives() -> None:
    progress = Playback()
    progress.sent(4.0)  # 50 frames
    progress.delivered(10.0, 2.0)  # plays 10..12
    progress.delivered(15.0, 2.0)  # dry 12..15, then plays 15..17
    assert progress.play_end == pytest.approx(17.0)
    # Already dry and more audio on the way: counted from now, not from the past deadline.
    progress.sent(2.0)  # 25 frames
    assert progress.deadline(now=20.0) == pytest.approx(22.0)


# ------------------------------------------------------------------ simulated load: fewer stalls than FIFO

FRAME_S = 0.08  # 12.5 Hz codec frames


def _simulate(policy: str, starts: list[float], chunks: int = 6, gen_s: float = 0.5, decode_s: float = 0.3) -> list[float]:
    """Streams start at ``starts``; each sends a 10-frame chunk, then a 25-frame chunk every ``gen_s`` (a talker
    faster than real time); code2wav decodes one chunk per ``decode_s``. Returns each stream's total stall (s)
    as a player that starts at its first packet would hear it (the bench's underrun measure)."""
    core = GenerationEngineCore(GenerationRunner(_Vocoder()), max_batch=1, policy=policy)
    progress = {f"s{i}": Playback() for i in range(len(starts))}
    arrivals = sorted((start + k * gen_s, f"s{i}", k) for i, start in enumerate(starts) for k in range(chunks))
    records = {rid: StreamRecord(0.0) for rid in progress}
    now = 0.0
    while arrivals or core.has_pending():
        while arrivals and arrivals[0][0] <= now:
            _, rid, k = arrivals.pop(0)
            frames = 10 if k == 0 else 25
            core.add_job(ChunkJob(rid, k, torch.zeros(2, frames, dtype=torch.long), 0,
                                  slack_s=progress[rid].deadline(now) - now), now)
            progress[rid].sent(frames * FRAME_S)
        if not core.has_pending():
            now = arrivals[0][0]
            continue
        now += decode_s
        for out in core.step():
            samples = int(out.wav.numel() * FRAME_S * 24000)  # the fake vocoder returns one value per frame
            progress[out.request_id].delivered(now, samples / 24000)
            records[out.request_id].add_audio(now, samples)
    return [r.underrun_s() for r in records.values()]


def test_deadline_policy_stalls_less_than_fifo_under_a_staggered_load() -> None:
    # Two streams already well buffered when two more start: round-robin serves the buffered ones in turn while
    # the new ones, with 0.8 s of audio, run dry; deadline order serves whoever runs out first.
    starts = [0.0, 0.0, 1.5, 1.6]
    fifo, deadline = _simulate("fifo", starts), _simulate("deadline", starts)
    assert sum(s > 0 for s in deadline) < sum(s > 0 for s in fifo)
    assert sum(deadline) < sum(fifo)


# code2wav busy ~50%, ~65%, ~80% of the time; the closer to capacity the less any order can do
@pytest.mark.parametrize(("decode_s", "at_most"), [(0.12, 0.0), (0.16, 0.25), (0.2, 0.75)])
def test_deadline_policy_underruns_less_with_random_arrivals_below_capacity(decode_s: float, at_most: float) -> None:
    fifo_runs = deadline_runs = 0
    for seed in range(6):
        rng = random.Random(seed)
        starts = sorted(rng.uniform(0.0, 3.0) for _ in range(8))
        fifo_runs += sum(s > 0 for s in _simulate("fifo", starts, chunks=8, decode_s=decode_s))
        deadline_runs += sum(s > 0 for s in _simulate("deadline", starts, chunks=8, decode_s=decode_s))
    assert fifo_runs > 0 and deadline_runs <= at_most * fifo_runs
