"""The talker's decode step profile: measured on probe requests before serving, leaving the engine as it was."""

from __future__ import annotations

from pathlib import Path

import pytest

from omnistage.config.pipeline import load_preset
from omnistage.families.qwen3_omni.family import PRESET as OMNI_PRESET
from omnistage.engine.step_profile import measure_decode_steps, profile_batches
from omnistage.workers.base import WorkerSpec


@pytest.mark.parametrize(("max_batch", "sizes"), [(0, []), (1, [1]), (4, [1, 2, 4]), (6, [1, 2, 4, 6]),
                                                  (8, [1, 2, 4, 8])])
def test_profile_batches(max_batch: int, sizes: list[int]) -> None:
    assert profile_batches(max_batch) == sizes


def test_the_talker_worker_profiles_its_step_and_frees_everything(tiny_dir: Path) -> None:
    from omnistage.families.qwen3_omni.workers import TalkerWorker

    spec = load_preset(OMNI_PRESET).stage("talker")
    worker = TalkerWorker(WorkerSpec(str(tiny_dir), spec))
    engine = worker.engine
    free = engine.scheduler.kv.num_free_blocks
    seconds = worker.step_profile()
    assert sorted(seconds) == [1, 2, 4, 8]  # the preset's default largest batch
    assert all(0 < s < 10 for s in seconds.values())
    assert not engine.has_unfinished_requests() and engine.scheduler.kv.num_free_blocks == free
    assert worker.load().running == 0 and not worker.request_ids()
    assert not engine.runner.batch.rows  # the runner dropped every probe's row too
    # The engine still serves afterwards: a probe request decodes as a served one would.
    request = worker.probe_request("after")
    engine.add_request(request)
    for _ in range(4):
        engine.step()
    assert request.num_output_tokens >= 2


def test_no_profile_when_turned_off(tiny_dir: Path) -> None:
    from dataclasses import replace

    from omnistage.families.qwen3_omni.workers import TalkerWorker

    spec = load_preset(OMNI_PRESET).stage("talker")
    spec = replace(spec, engine=replace(spec.engine, step_profile_max_batch=0))
    assert TalkerWorker(WorkerSpec(str(tiny_dir), spec)).step_profile() == {}


def test_a_size_whose_requests_never_get_decoding_is_left_out(tiny_dir: Path) -> None:
    """A probe that cannot reach decode within the setup budget (here: stuck waiting) gives no figure."""
    from omnistage.families.qwen3_omni.workers import TalkerWorker
    from omnistage.runner.talker_hook import TalkerRequestData

    worker = TalkerWorker(WorkerSpec(str(tiny_dir), load_preset(OMNI_PRESET).stage("talker")))

    def waiting_probe(rid: str):  # noqa: ANN202 - its trailing text never arrives: not ready after the prefill
        request = worker.probe_request(rid)
        request.stage_data = TalkerRequestData(tts_pad_embed=request.stage_data.tts_pad_embed)
        return request

    assert measure_decode_steps(worker.engine, waiting_probe, [1, 2]) == {}
    assert not worker.engine.has_unfinished_requests()
