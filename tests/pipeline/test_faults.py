"""A stage replica process killed under load: only its requests fail, it is restarted, and serving resumes."""

from __future__ import annotations

import os
import queue
import signal
import time

import pytest

from omnistage.core import FinishReason, Modality, OmniOutput, OmniRequest
from omnistage.pipeline.runtime import PipelineOptions, PipelineRuntime
from omnistage.families.qwen3_omni.prompt import Qwen3OmniPrompt
from omnistage.sampling_params import SamplingParams
from tests.pipeline import fakes
from tests.pipeline.specs import small_spec

pytestmark = pytest.mark.e2e


def _request(rid: str, max_tokens: int, audio: bool = True) -> OmniRequest:
    modalities = {Modality.TEXT, Modality.AUDIO} if audio else {Modality.TEXT}
    return OmniRequest(rid, Qwen3OmniPrompt([1, 2, 3]), frozenset(modalities), SamplingParams(max_tokens=max_tokens))


def _wait(predicate, timeout_s: float) -> bool:  # noqa: ANN001 - a zero-argument callable
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def _final(outputs: queue.Queue, timeout_s: float) -> OmniOutput:
    deadline = time.monotonic() + timeout_s
    while True:
        out = outputs.get(timeout=max(deadline - time.monotonic(), 0.01))
        if out.finished:
            return out


def _replica(rt: PipelineRuntime, stage: str):  # noqa: ANN202 - the orchestrator's ReplicaLink
    return rt.orchestrator.links[(stage, 0)]


def _stage_healthy(rt: PipelineRuntime, stage: str) -> bool:
    return next(s for s in rt.orchestrator.health().stages if s.stage == stage).healthy


@pytest.mark.parametrize("stage", ["talker", "thinker"])
def test_a_killed_replica_fails_only_its_requests_and_comes_back(stage: str) -> None:
    # Two talker replicas: killing talker 0 must leave the streams on talker 1 untouched.
    factories = fakes.fake_factories(thinker_step_s=0.01, talker_step_s=0.01)
    rt = PipelineRuntime(fakes.omni_graph(small_spec(talker_replicas=2, talker_frames=100_000)), factories, None, fakes.AUDIO,
                         PipelineOptions(talker_min_new_tokens=100_000))
    try:
        streams = {f"r{i}": queue.Queue() for i in range(8)}
        for rid, sink in streams.items():
            rt.orchestrator.submit(_request(rid, max_tokens=100_000), sink.put)
        # Every stream is producing before the kill.
        assert _wait(lambda: all(not q.empty() for q in streams.values()), 30)
        assert _wait(lambda: len(rt.orchestrator.routers["talker"].requests_on(0)) == 4, 30)
        victims = set(rt.orchestrator.routers[stage].requests_on(0))
        survivors = set(streams) - victims
        link = _replica(rt, stage)
        old_pid = link.handle.pid
        os.kill(old_pid, signal.SIGKILL)

        for rid in victims:
            final = _final(streams[rid], 20)
            assert final.finish_reason is FinishReason.ERROR and f"'{stage}' replica 0" in final.error
        # The others keep streaming (talker case) or had nowhere else to be (the single thinker).
        for rid in survivors:
            assert streams[rid].empty() or not any(o.finished for o in list(streams[rid].queue))
        if stage == "thinker":
            assert not survivors
            assert not rt.orchestrator.health().healthy  # the whole stage is gone until the restart
        # Restarted: a new process, healthy again, and /health's detail says so.
        assert _wait(lambda: _stage_healthy(rt, stage) and link.handle.pid != old_pid
                     and all(r.healthy for s in rt.orchestrator.health().stages for r in s.replicas), 60)
        detail = next(r.detail for s in rt.orchestrator.health().stages if s.stage == stage for r in s.replicas
                      if r.replica == 0)
        assert detail == "restarted 1 time(s)"
        # A new request goes through every stage (audio comes back) after the restart.
        after: queue.Queue = queue.Queue()
        rt.orchestrator.submit(_request("after", max_tokens=100_000), after.put)
        deadline = time.monotonic() + 30
        while (out := after.get(timeout=max(deadline - time.monotonic(), 0.01))).audio is None:
            assert not out.finished, out.error
        rt.orchestrator.abort("after")
        for rid in survivors:
            rt.orchestrator.abort(rid)
    finally:
        rt.close()
