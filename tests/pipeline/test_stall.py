"""A hung replica is found by its silence, not its pulse: SIGSTOP keeps the process alive, but every thread of it,
the heartbeat's too, stops sending; after --stage-stall-timeout its requests fail, it is killed and restarted, and
the other stages serve on throughout. A step longer than that timeout is not a hang (its pulse thread beats on); one
that never ends is, after --stage-step-timeout."""

from __future__ import annotations

import os
import queue
import signal
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import pytest

from omnistage.core import FinishReason, Modality, OmniOutput, OmniRequest
from omnistage.pipeline.liveness import (
    BACKOFF_RESET_S,
    DEFAULT_STALL_TIMEOUT_S,
    RESTART_BACKOFF_S,
    Liveness,
    StallBounds,
)
from omnistage.pipeline.runtime import PipelineOptions, PipelineRuntime
from omnistage.families.qwen3_omni.prompt import Qwen3OmniPrompt
from omnistage.sampling_params import SamplingParams
from omnistage.workers.base import StepResult
from tests.pipeline import fakes
from tests.pipeline.specs import small_spec
from tests.waiting import wait_until

pytestmark = pytest.mark.e2e
STALL_S = 2.0


def _request(rid: str, max_tokens: int, audio: bool) -> OmniRequest:
    modalities = {Modality.TEXT, Modality.AUDIO} if audio else {Modality.TEXT}
    return OmniRequest(rid, Qwen3OmniPrompt([1, 2, 3]), frozenset(modalities), SamplingParams(max_tokens=max_tokens))


def _final(outputs: queue.Queue, timeout_s: float) -> OmniOutput:
    deadline = time.monotonic() + timeout_s
    while not (out := outputs.get(timeout=max(deadline - time.monotonic(), 0.01))).finished:
        pass
    return out


def _stage(rt: PipelineRuntime, name: str):  # noqa: ANN202 - the health report's StageHealth
    return next(s for s in rt.orchestrator.health().stages if s.stage == name)


@dataclass
class SlowFirstStepThinker(fakes.FakeThinker):
    """A fake thinker whose first step is a long prefill: ``first_step_s`` of Python spinning on the GIL (``spin``)
    or of sleep (a step that waits in a kernel)."""

    first_step_s: float = 0.0
    spin: bool = True
    steps: int = 0

    def step(self) -> StepResult:
        self.steps += 1
        if self.steps == 1:
            end = time.monotonic() + self.first_step_s
            while self.spin and time.monotonic() < end:
                pass  # pure bytecode: the pulse thread gets the GIL only at the interpreter's switch interval
            time.sleep(max(end - time.monotonic(), 0.0))
        return super().step()


def _slow_first_step_runtime(first_step_s: float, spin: bool, step_timeout_s: float) -> PipelineRuntime:
    factories = fakes.fake_factories()
    factories["thinker"] = partial(SlowFirstStepThinker, first_step_s=first_step_s, spin=spin)
    options = PipelineOptions(stage_stall_timeout_s=STALL_S, stage_step_timeout_s=step_timeout_s)
    return PipelineRuntime(fakes.omni_graph(small_spec()), factories, None, fakes.AUDIO, options)


def test_a_step_longer_than_the_stall_timeout_is_not_taken_for_a_hang() -> None:
    """A prefill spinning the CPU for twice the stall timeout: the pulse thread beats on, the request finishes, and
    the replica is never killed."""
    rt = _slow_first_step_runtime(first_step_s=STALL_S * 2.5, spin=True, step_timeout_s=60.0)
    link = rt.orchestrator.links[("thinker", 0)]
    pid = link.handle.pid
    try:
        out: queue.Queue = queue.Queue()
        rt.orchestrator.submit(_request("long-prefill", 3, audio=False), out.put)
        final = _final(out, STALL_S * 2.5 + 20)
        assert final.finish_reason is FinishReason.LENGTH, final.error
        assert link.handle.pid == pid and link.restarts == 0 and rt.orchestrator.health().healthy
    finally:
        rt.close()


def test_a_step_that_never_ends_is_a_hang_after_the_step_timeout() -> None:
    """Heartbeats alone do not keep a replica healthy: a step that never finishes (a deadlocked kernel, here a
    sleep) fails its request naming --stage-step-timeout, and the replica is killed and replaced."""
    step_timeout = STALL_S * 2
    rt = _slow_first_step_runtime(first_step_s=3600.0, spin=False, step_timeout_s=step_timeout)
    link = rt.orchestrator.links[("thinker", 0)]
    old_pid = link.handle.pid
    try:
        out: queue.Queue = queue.Queue()
        started = time.monotonic()
        rt.orchestrator.submit(_request("deadlocked", 3, audio=False), out.put)
        final = _final(out, step_timeout + 15)
        detected = time.monotonic() - started
        assert final.finish_reason is FinishReason.ERROR
        assert "--stage-step-timeout" in final.error and "stalled" in final.error, final.error
        assert step_timeout <= detected < step_timeout + 4, f"detected after {detected:.1f} s"
        assert wait_until(lambda: not Path(f"/proc/{old_pid}").exists(), 10)
        assert wait_until(lambda: rt.orchestrator.health().healthy and link.handle.pid != old_pid, 60)
    finally:
        rt.close()


def test_the_two_bounds_tell_a_silent_replica_from_a_stuck_step() -> None:
    bounds = StallBounds(silence_s=2.0, step_s=5.0)
    live = Liveness()
    live.became_healthy(0.0)
    for t in range(1, 5):  # beating, the pass count moving: fine however long
        live.beat(float(t), passes=t)
    assert live.hung(4.5, bounds) == ""
    for t in range(5, 10):  # beating, the count frozen at 4 since t=4: a step past 5 s is stuck
        live.beat(float(t), passes=4)
    assert live.hung(9.0, bounds) == ""
    assert "--stage-step-timeout" in live.hung(9.5, bounds)
    live.beat(10.0, passes=0)  # a new count (e.g. a restarted loop) is progress, not a step back
    assert live.hung(12.5, bounds).startswith("stalled: no heartbeat for 2.5 s (--stage-stall-timeout")


def test_the_default_stall_timeout_suits_a_voice_server() -> None:
    assert DEFAULT_STALL_TIMEOUT_S <= 10.0
    assert StallBounds().step_s > StallBounds().silence_s
    with pytest.raises(ValueError, match="heartbeat"):
        StallBounds(silence_s=0.5)
    with pytest.raises(ValueError, match="step timeout"):
        PipelineOptions(stage_stall_timeout_s=10.0, stage_step_timeout_s=5.0)


def test_a_stopped_replica_is_detected_killed_and_replaced_while_other_stages_serve() -> None:
    factories = fakes.fake_factories(thinker_step_s=0.01, talker_step_s=0.01)
    rt = PipelineRuntime(fakes.omni_graph(small_spec(talker_frames=100_000)), factories, None, fakes.AUDIO,
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
