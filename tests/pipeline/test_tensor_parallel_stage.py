"""A thinker stage with ``tensor_parallel_size: 2`` through the whole pipeline (stage processes, gloo): the
orchestrator sees one thinker replica, its second rank is a child process of that replica, greedy tokens equal
the unsharded thinker's, audio still comes out, and no rank outlives the pipeline."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest
import torch

from omnistage.pipeline.omni import Omni
from omnistage.families.qwen3_omni.offline import StageModels
from omnistage.families.qwen3_omni.stages import build_thinker_request
from omnistage.families.qwen3_omni.thinker_hook import ThinkerStepHook
from omnistage.pipeline.runtime import PipelineOptions
from omnistage.runner import build_ar_engine
from omnistage.sampling_params import SamplingParams
from tests.pipeline.specs import small_dict, write_spec
from tests.pipeline.test_processes import _wait_gone

pytestmark = pytest.mark.e2e
TOKENS = 16


def _cmdline(pid: int) -> str:
    """A process's command line; empty once it is gone (a short-lived child can exit between listing and reading)."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_text()
    except FileNotFoundError:
        return ""


def _children(pid: int) -> list[int]:
    tasks = Path(f"/proc/{pid}/task")
    return [int(c) for t in tasks.iterdir() for c in (t / "children").read_text().split()]


def _unsharded_tokens(tiny_dir: Path, omni: Omni) -> list[int]:
    models = StageModels.load(tiny_dir, "cpu", torch.float32)
    prompt = omni.prompt("Hello!")
    request = build_thinker_request(models.thinker, "ref", prompt.token_ids, prompt.mm,
                                    SamplingParams(temperature=0.0, max_tokens=TOKENS, ignore_eos=True),
                                    models.eos_token_id)
    engine = build_ar_engine(models.thinker, models.engine_config(len(prompt.token_ids) + TOKENS), ThinkerStepHook())
    engine.add_request(request)
    engine.run_until_done()
    return list(request.output_token_ids)


def test_tensor_parallel_thinker_through_stage_processes(tiny_dir: Path, tmp_path: Path) -> None:
    data = small_dict(talker_frames=12)
    data["stages"][0]["tensor_parallel_size"] = 2
    omni = Omni(tiny_dir, write_spec(tmp_path, data), options=PipelineOptions(talker_min_new_tokens=6))
    try:
        links = omni.pipeline.runtime.orchestrator.links
        pids = [link.handle.pid for link in links.values()]
        assert len(links) == 3  # one replica per stage: the ranks are the thinker replica's business
        thinker_pid = links[("thinker", 0)].handle.pid
        ranks = [pid for pid in _children(thinker_pid) if "tp_worker" in _cmdline(pid)]
        assert len(ranks) == 1
        out = next(omni.generate("Hello!", modalities=["text", "audio"], max_tokens=TOKENS, ignore_eos=True,
                                 temperature=0.0))
        assert out.finished and len(out.token_ids) == TOKENS
        assert out.audio is not None and np.asarray(out.audio).size > 0
        assert list(out.token_ids) == _unsharded_tokens(tiny_dir, omni)
    finally:
        omni.close()
    start = time.monotonic()
    assert _wait_gone(pids + ranks, 10) == [], f"left after {time.monotonic() - start:.1f} s"
