"""A hung replica is found by its silence, not its pulse: SIGSTOP keeps the process alive, but its engine loop
stops sending; after --stage-stall-timeout its requests fail, it is killed and restarted, and the other stages
serve on throughout."""

from __future__ import annotations

import os
import queue
import signal
import time
from pathlib import Path

import pytest

from omnistage.core import FinishReason, Modality, OmniOutput, OmniRequest, RequestSampling
from omnistage.pipeline.liveness import BACKOFF_RESET_S, RESTART_BACKOFF_S, Liveness
from omnistage.pipeline.runtime import PipelineOptions, PipelineRuntime
from omnistage.families.qwen3_omni.prompt import Qwen3OmniPrompt
from tests.pipeline import fakes
from tests.pipeline.specs import small_spec
from tests.waiting import wait_until

pytestmark = pytest.mark.e2e
STALL_S = 2.0


def _request(rid: str, max_tokens: int, audio: bool) -> OmniRequest:
    modalities = {Modality.TEXT, Modality.AUDIO} if audio else {Modality.TEXT}
    return OmniRequest(rid, Qwen3OmniPrompt([1, 2, 3]), frozenset(modalities), RequestSampling(max_tokens=max_tokens))


def _final(outputs: queue.Queue, timeout_s: float) -> OmniOutput:
    deadline = time.monotonic() + timeout_s
    while not (out := outputs.get(timeout=max(deadline - time.monotonic(), 0.01))).finished:
        pass
    return out


def _stage(rt: PipelineRuntime, name: str):  # noqa: ANN202 - the health report's StageHealth
    return next(s for s in rt.orchestrator.health().stages if s.stage == name)


def test_a_stopped_replica_is_detected_killed_and_replaced_while_other_stages_serve() -> None:
    factories = fakes.fake_factories(thinker_step_s=0.01, talker_step_s=0.01)
    rt = PipelineRuntime(fakes.omni_graph(small_spec(talker_frames=100_000)), factories, None, fakes.GROUPS,
                         PipelineOptions(talker_min_new_tokens=100_000, stage_stall_timeout_s=STALL_S))
    link = rt.orchestrator.links[("code2wav", 0)]
    old_pid = link.handle.pid
    stopped = False
    try:
        # Idle past the stall timeout: the heartbeats keep every replica healthy.
        time.sleep(STALL_S * 1.5)
        assert rt.orchestrator.health().healthy and link.handle.pid == old_pid

        streams = {f"s{i}": queue.Queue() for i in range(3)}
        for rid, sink in streams.items():
            rt.orchestrator.submit(_request(rid, 100_000, audio=True), sink.put)
        assert wait_until(lambda: all(any(o.audio is not None for o in list(q.queue)) for q in streams.values()), 30)

        os.kill(old_pid, signal.SIGSTOP)
        stopped = True
        started = time.monotonic()
        text_only: queue.Queue = queue.Queue()
        rt.orchestrator.submit(_request("text-only", 20, audio=False), text_only.put)
        assert _final(text_only, 10).finish_reason is FinishReason.LENGTH  # the thinker serves on

        for rid, sink in streams.items():
            final = _final(sink, STALL_S + 10)
            assert final.finish_reason is FinishReason.ERROR, (rid, final)
            assert "'code2wav' replica 0" in final.error and "stalled" in final.error
            assert "--stage-stall-timeout" in final.error
        detected = time.monotonic() - started
        assert detected < STALL_S + 4, f"detected after {detected:.1f} s"
        assert not _stage(rt, "code2wav").healthy or link.handle.pid != old_pid
        # Killed (a stopped process still dies of SIGKILL), then restarted as a new process.
        assert wait_until(lambda: not Path(f"/proc/{old_pid}").exists(), 10)
        stopped = False
        assert wait_until(lambda: rt.orchestrator.health().healthy and link.handle.pid != old_pid, 60)
        detail = _stage(rt, "code2wav").replicas[0].detail
        assert detail == "restarted 1 time(s)"

        after: queue.Queue = queue.Queue()
        rt.orchestrator.submit(_request("after", 100_000, audio=True), after.put)
        assert wait_until(lambda: any(o.audio is not None for o in list(after.queue)), 30)
        rt.orchestrator.abort("after")
    finally:
        if stopped:
            os.kill(old_pid, signal.SIGCONT)
        rt.close()


def test_restart_backoff_doubles_and_starts_over_after_a_healthy_period() -> None:
    first, cap = RESTART_BACKOFF_S
    live = Liveness()
    now = 1000.0
    delays = []
    for _ in range(8):
        live.became_healthy(now)
        now += 5.0  # healthy only briefly each time: the backoff keeps growing
        delays.append(live.restart_delay(now))
    assert delays == [min(first * 2**i, cap) for i in range(8)]
    live.became_healthy(now)
    now += BACKOFF_RESET_S + 1  # then healthy for a good while: back to the first wait
    assert live.restart_delay(now) == first
    assert live.restart_delay(now + 1) == first * 2  # (down again without ever coming back: it grows)
