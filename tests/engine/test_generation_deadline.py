"""Code2wav's playback-deadline policy: the stream about to run dry is decoded first."""

from __future__ import annotations

import pytest
import torch

from omnistage.engine.generation_engine import ChunkJob, GenerationEngineCore
from omnistage.pipeline.request_state import AudioProgress
from omnistage.runner.generation_runner import GenerationRunner
from omnistage.tools.bench.metrics import StreamRecord


class _Vocoder:
    def decode_chunk(self, codes: torch.Tensor, left_context: int) -> torch.Tensor:
        return codes[:, 0, left_context:].float()


def _job(rid: str, index: int, deadline: float) -> ChunkJob:
    return ChunkJob(rid, index, torch.zeros(2, 4, dtype=torch.long), 0, deadline=deadline)


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


def test_audio_progress_deadline_is_play_start_plus_audio_sent() -> None:
    progress = AudioProgress(chunker=None, initial_chunk_frames=10)  # type: ignore[arg-type]
    assert progress.deadline(now=100.0) == 101.0  # not started: a second of start-up slack
    progress.frames_sent = 25
    assert progress.deadline(now=100.0) == pytest.approx(103.0)
    progress.play_start = 50.0
    assert progress.deadline(now=100.0) == pytest.approx(52.0)


# ------------------------------------------------------------------ simulated load: fewer stalls than FIFO

FRAME_S = 0.08  # 12.5 Hz codec frames


def _simulate(policy: str, starts: list[float], chunks: int = 6, gen_s: float = 0.5, decode_s: float = 0.3) -> list[float]:
    """Streams start at ``starts``; each sends a 10-frame chunk, then a 25-frame chunk every ``gen_s`` (a talker
    faster than real time); code2wav decodes one chunk per ``decode_s``. Returns each stream's total stall (s)
    as a player that starts at its first packet would hear it (the bench's underrun measure)."""
    core = GenerationEngineCore(GenerationRunner(_Vocoder()), max_batch=1, policy=policy)
    progress = {f"s{i}": AudioProgress(chunker=None, initial_chunk_frames=10) for i in range(len(starts))}  # type: ignore[arg-type]
    arrivals = sorted((start + k * gen_s, f"s{i}", k) for i, start in enumerate(starts) for k in range(chunks))
    records = {rid: StreamRecord(0.0) for rid in progress}
    now = 0.0
    while arrivals or core.has_pending():
        while arrivals and arrivals[0][0] <= now:
            _, rid, k = arrivals.pop(0)
            frames = 10 if k == 0 else 25
            core.add_job(ChunkJob(rid, k, torch.zeros(2, frames, dtype=torch.long), 0,
                                  deadline=progress[rid].deadline(now, FRAME_S)))
            progress[rid].frames_sent += frames
        if not core.has_pending():
            now = arrivals[0][0]
            continue
        now += decode_s
        for out in core.step():
            if progress[out.request_id].play_start is None:
                progress[out.request_id].play_start = now
            records[out.request_id].add_audio(now, int(out.wav.numel() * FRAME_S * 24000))
    return [r.underrun_s() for r in records.values()]


def test_deadline_policy_stalls_less_than_fifo_under_a_staggered_load() -> None:
    # Two streams already well buffered when two more start: round-robin serves the buffered ones in turn while
    # the new ones, with 0.8 s of audio, run dry; deadline order serves whoever runs out first.
    starts = [0.0, 0.0, 1.5, 1.6]
    fifo, deadline = _simulate("fifo", starts), _simulate("deadline", starts)
    assert sum(s > 0 for s in deadline) < sum(s > 0 for s in fifo)
    assert sum(deadline) < sum(fifo)
