"""Code2wav's playback-deadline policy: the stream about to run dry is decoded first."""

from __future__ import annotations

import pytest
import torch

from omnistage.engine.generation_engine import ChunkJob, GenerationEngineCore
from omnistage.pipeline.request_state import AudioProgress
from omnistage.runner.generation_runner import GenerationRunner


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
