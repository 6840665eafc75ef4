"""The step loop with a fake runner, sampling-parameter validation, and the Code2Wav engine."""

from __future__ import annotations

import pytest
import torch

from omnistage.engine import EngineCore, Request
from omnistage.engine.generation_engine import ChunkJob, GenerationEngineCore, StreamVoice
from omnistage.runner.generation_runner import GenerationRunner
from omnistage.sampling_params import SamplingParams
from tests.engine.factories import FakeRunner, make_config, make_request


def test_step_loop_streams_tokens_and_tells_runner_what_finished() -> None:
    config = make_config()
    runner = FakeRunner(config.num_blocks)
    core = EngineCore(runner, config)
    core.add_request(make_request("a", max_tokens=3))
    core.add_request(make_request("b", max_tokens=1, first_token=40))
    outputs = core.run_until_done()
    by_id: dict[str, list[int]] = {}
    for out in outputs:
        by_id.setdefault(out.request_id, []).extend(out.new_token_ids)
    assert {k: len(v) for k, v in by_id.items()} == {"a": 3, "b": 1}
    assert [o.finished for o in outputs if o.request_id == "a"] == [False, False, True]
    core.add_request(make_request("c"))
    core.step()
    assert sorted(runner.dropped) == ["a", "b"]  # handed over on the next step


def test_abort_reaches_runner_even_without_work() -> None:
    config = make_config()
    runner = FakeRunner(config.num_blocks)
    core = EngineCore(runner, config)
    core.add_request(make_request("a"))
    core.step()
    assert core.abort_request("a") and not core.abort_request("a")
    assert core.step() == [] and runner.dropped == ["a"]
    assert not core.has_unfinished_requests()


def test_engine_mirrors_runner_block_count() -> None:
    config = make_config(num_blocks=50)
    core = EngineCore(FakeRunner(num_blocks=9), config)
    assert core.scheduler.kv.pool.num_blocks == 9


def test_stuck_hook_is_reported_not_spun_forever() -> None:
    config = make_config()
    core = EngineCore(FakeRunner(config.num_blocks, is_ready=lambda r: r.num_output_tokens == 0), config)
    core.add_request(make_request("a"))
    with pytest.raises(RuntimeError, match="no progress"):
        core.run_until_done(max_idle_steps=3)


@pytest.mark.parametrize("bad", [
    dict(temperature=-1.0), dict(top_p=0.0), dict(top_p=1.5), dict(top_k=-1), dict(repetition_penalty=0.0),
    dict(max_tokens=0), dict(min_tokens=5, max_tokens=4), dict(seed=-3),
])
def test_sampling_params_reject_bad_values(bad: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        SamplingParams(**bad)


def test_sampling_params_are_frozen_and_normalised() -> None:
    params = SamplingParams(stop_token_ids=[3, 4], temperature=0)
    assert params.stop_token_ids == (3, 4) and params.greedy and hash(params)
    with pytest.raises(AttributeError):
        params.temperature = 1.0  # type: ignore[misc]


def test_request_validates_prompt_shapes() -> None:
    with pytest.raises(ValueError):
        Request("x", [], SamplingParams())
    with pytest.raises(ValueError):
        Request("x", [1, 2], SamplingParams(), prompt_embeds=torch.zeros(3, 4))
    with pytest.raises(ValueError):
        Request("x", [1, 2], SamplingParams(), prompt_positions=torch.zeros(3, 5, dtype=torch.long))
    req = Request("x", None, SamplingParams(), prompt_embeds=torch.zeros(3, 4))
    assert req.num_tokens == 3 and req.token_ids(0, 3) == [0, 0, 0] and not req.prefix_cacheable


class _FakeVocoder:
    """Each frame becomes ``spf`` samples equal to the frame's first code; records each call's batch."""

    def __init__(self, spf: int = 4) -> None:
        self.spf = spf
        self.calls: list[tuple[int, int, int]] = []

    def decode_chunk(self, codes: torch.Tensor, left_context: int) -> torch.Tensor:
        self.calls.append((codes.shape[0], codes.shape[2], left_context))
        return codes[:, 0, left_context:].float().repeat_interleave(self.spf, dim=1)


def _job(rid: str, index: int, frames: int, left: int, is_last: bool = False) -> ChunkJob:
    codes = torch.arange(frames).repeat(3, 1) + 100 * index
    return ChunkJob(rid, index, codes, left, is_last)


def test_generation_engine_batches_requests_and_keeps_chunk_order() -> None:
    vocoder = _FakeVocoder()
    core = GenerationEngineCore(GenerationRunner(vocoder), max_batch=8)
    for rid in ("a", "b", "c"):
        core.add_job(_job(rid, 0, 6, 0))
        core.add_job(_job(rid, 1, 6, 2))
    core.add_job(_job("c", 2, 3, 2, is_last=True))
    outputs = core.run_until_done()
    assert vocoder.calls == [(3, 6, 0), (3, 6, 2), (1, 3, 2)]
    for rid in ("a", "b", "c"):
        assert [o.chunk_index for o in outputs if o.request_id == rid] == list(range(3 if rid == "c" else 2))
    last = outputs[-1]
    assert last.is_last and last.wav.shape == (4,) and last.wav[0] == 202.0


def test_generation_engine_abort_drops_pending_chunks() -> None:
    core = GenerationEngineCore(GenerationRunner(_FakeVocoder()))
    core.add_job(_job("a", 0, 4, 0))
    core.add_job(_job("b", 0, 4, 0))
    assert core.abort_request("a")
    assert [o.request_id for o in core.run_until_done()] == ["b"]
    with pytest.raises(ValueError):
        _job("bad", 0, 4, 4)


class _FakeWindows:
    """A vocoder of overlapping windows conditioned per stream: each frame of a chunk past its left context (its
    look-ahead too) becomes ``samples_per_frame`` samples of the frame's code plus the stream's seed."""

    samples_per_frame = 2

    def __init__(self) -> None:
        self.opened: list[tuple[str, str, int]] = []
        self.seeds: dict[str, int] = {}
        self.lookaheads: list[int] = []

    def open_stream(self, stream_id: str, voice: str, seed: int) -> None:
        self.opened.append((stream_id, voice, seed))
        self.seeds[stream_id] = seed

    def decode_windows(self, stream_ids: list[str], indices: list[int], chunks: list[torch.Tensor],
                       left_contexts: list[int], lookaheads: list[int], lasts: list[bool]) -> list[torch.Tensor]:
        self.lookaheads += lookaheads
        return [(c[0, ctx:].float() + self.seeds[sid]).repeat_interleave(self.samples_per_frame)
                for sid, c, ctx in zip(stream_ids, chunks, left_contexts)]

    def drop(self, stream_id: str) -> None:
        self.seeds.pop(stream_id, None)


def test_a_windowed_vocoder_hears_each_streams_voice_and_its_look_ahead_is_dropped() -> None:
    vocoder = _FakeWindows()
    core = GenerationEngineCore(GenerationRunner(vocoder), max_batch=8)
    codes = torch.arange(10).view(1, 10)
    core.add_job(ChunkJob("a", 0, codes[:, :6], 0, lookahead=2, voice=StreamVoice("Ethan", 100)))
    core.add_job(ChunkJob("b", 0, codes[:, :3], 0, is_last=True))  # no voice sent: the default one
    core.add_job(ChunkJob("a", 1, codes[:, 2:], 2, is_last=True))
    outputs = core.run_until_done()
    assert vocoder.opened == [("a", "Ethan", 100), ("b", "", 0)] and vocoder.lookaheads == [2, 0, 0]
    wavs = {(o.request_id, o.chunk_index): o.wav for o in outputs}
    assert wavs[("a", 0)].tolist() == [100.0, 100.0, 101.0, 101.0, 102.0, 102.0, 103.0, 103.0]
    assert wavs[("a", 1)].tolist()[:2] == [104.0, 104.0] and wavs[("a", 1)].shape == (12,)
