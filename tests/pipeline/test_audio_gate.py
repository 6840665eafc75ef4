"""Admission that protects running streams: a new audio request waits while it would push them past real time."""

from __future__ import annotations

import queue

import pytest

from omnistage.config.pipeline import parse_pipeline
from omnistage.core import FinishReason, Modality, OmniOutput, OmniRequest
from omnistage.pipeline.audio_gate import (
    MARGINAL_PRIOR,
    MIN_BUFFER_S,
    PREFILL_HEADROOM,
    RECENT_CALLS,
    AudioGate,
    StepProfile,
    StreamLoad,
)
from omnistage.pipeline.runtime import PipelineOptions, PipelineRuntime
from omnistage.families.qwen3_omni.prompt import Qwen3OmniPrompt
from omnistage.sampling_params import SamplingParams
from tests.pipeline import fakes
from tests.pipeline.specs import small_dict

FRAME_S = fakes.AUDIO.frame_s


def _streams(*rtfs: float | None) -> list[StreamLoad]:
    return [StreamLoad(True, None if r is None else r * FRAME_S) for r in rtfs]


def _paces(*rtfs: float | None) -> list[float | None]:
    """What the gate observes: each talking stream's seconds per frame."""
    return [s.talker_frame_s for s in _streams(*rtfs)]


def test_no_stream_running_always_admits_and_an_unmeasured_talker_waits() -> None:
    gate = AudioGate(limit=0.9, frame_s=FRAME_S)
    assert gate.admits([])
    gate.observe(_paces(None))  # a stream started, its talker pace not measured yet: nothing recorded
    assert not gate.admits(_streams(None))
    assert AudioGate(limit=0.0, frame_s=FRAME_S).admits(_streams(5.0))  # no gate


def test_one_count_measured_assumes_a_batched_talker_then_follows_the_measured_slope() -> None:
    gate = AudioGate(limit=0.9, frame_s=FRAME_S)
    gate.observe(_paces(0.6))
    assert gate.rtf(2, 2) == pytest.approx(0.6 * (1 + MARGINAL_PRIOR))
    assert gate.admits(_streams(0.6))
    gate.observe(_paces(0.66, 0.66))
    assert gate.rtf(3, 3) == pytest.approx(0.72)  # along the line through 1 and 2 streams
    assert gate.admits(_streams(0.66, 0.66))
    gate.observe(_paces(0.8, 0.8, 0.8))
    assert gate.rtf(4, 4) == pytest.approx(0.94)  # the talker saturates: along the newest slope
    assert gate.rtf(2, 2) == pytest.approx(0.66)  # measured counts are used as they are
    assert not gate.admits(_streams(0.8, 0.8, 0.8))


def test_a_stream_still_in_its_first_frames_is_counted_but_not_measured() -> None:
    gate = AudioGate(limit=0.9, frame_s=FRAME_S)
    gate.observe(_paces(0.6))
    gate.observe(_paces(0.6, None))  # the second stream's pace is unknown: no point at 2 streams
    assert gate.talker_pace(2) == pytest.approx(0.6 * FRAME_S * (1 + MARGINAL_PRIOR))
    assert not gate.admits(_streams(0.6, None))  # 3 streams predicted at 0.6 * 1.5 = 0.9... and a bit


def test_vocoder_load_scales_with_streams() -> None:
    gate = AudioGate(limit=0.9, frame_s=FRAME_S)
    gate.observe(_paces(0.1))
    gate.observe(_paces(0.1, 0.1))
    gate.observe(_paces(0.1, 0.1, 0.1))
    gate.vocoded(busy_s=0.3, audio_s=1.0)  # 0.3 s of vocoder per second of audio
    assert gate.rtf(2, 2) == pytest.approx(0.6)
    assert gate.admits(_streams(0.1, 0.1))  # 3 streams: 0.9
    assert not gate.admits(_streams(0.1, 0.1, 0.1))  # 4 streams: 1.2
    finishing = [StreamLoad(False)] * 3  # talkers done, code2wav still busy with them
    assert not gate.admits(finishing)


def test_a_cold_vocoder_call_does_not_hold_the_next_streams() -> None:
    """A fresh code2wav's first calls are slow (a new chunk length's first run builds its kernels); the load is the
    median of recent calls, so those do not read as load for the rest of a burst."""
    gate = AudioGate(limit=0.8, frame_s=FRAME_S)
    gate.observe(_paces(0.1, 0.1, 0.1))
    gate.vocoded(busy_s=0.25, audio_s=1.0)
    assert gate.rtf(4, 4) == pytest.approx(1.0)  # one call measured: it is all there is
    for busy in (0.12, 0.05, 0.04, 0.05):
        gate.vocoded(busy_s=busy, audio_s=1.0)
    assert gate.rtf(4, 4) == pytest.approx(0.2)
    assert gate.admits(_streams(0.1, 0.1, 0.1))
    for _ in range(RECENT_CALLS):  # a lasting slowdown is load again
        gate.vocoded(busy_s=0.3, audio_s=1.0)
    assert not gate.admits(_streams(0.1, 0.1, 0.1))


def test_the_vocoder_load_is_the_median_second_of_audio_not_the_median_chunk() -> None:
    """Each stream's small first chunk costs more per second of audio than its later ones (a call's fixed cost, a
    window's context): counted by chunks, three streams' first chunks would outvote the audio they barely made."""
    gate = AudioGate(limit=0.8, frame_s=FRAME_S)
    gate.observe(_paces(0.1, 0.1, 0.1))
    for _ in range(3):
        gate.vocoded(busy_s=0.1, audio_s=0.2)  # a first chunk: 0.5 s a second
    for _ in range(2):
        gate.vocoded(busy_s=0.15, audio_s=1.0)  # a later one: 0.15 s a second
    assert gate.vocoder_busy.value == pytest.approx(0.15)
    assert gate.admits(_streams(0.1, 0.1, 0.1))  # 4 streams: 0.6


def _request(rid: str, audio: bool = True) -> OmniRequest:
    modalities = frozenset({Modality.TEXT, Modality.AUDIO} if audio else {Modality.TEXT})
    return OmniRequest(rid, Qwen3OmniPrompt([1, 2, 3]), modalities, SamplingParams(max_tokens=30))


def _runtime(limit: float) -> PipelineRuntime:
    """A talker whose step takes 64 ms per stream (it does not batch): one stream runs at 0.8x real time, two at
    1.6x, so two at once would both underrun (a batched talker's prior, +25% a stream, says 1.0: wait)."""
    data = small_dict(talker_frames=30)
    data["streaming"]["admission_rtf_limit"] = limit
    fakes.INSTANCES.clear()
    return PipelineRuntime(fakes.omni_graph(parse_pipeline(data)), fakes.fake_factories(0.001, talker_step_s_per_seq=0.064), None,
                           fakes.AUDIO, PipelineOptions(in_process=True))


def _run_two(runtime: PipelineRuntime) -> tuple[float, float]:
    """Starts a, then b once a is streaming; returns (a's talker done, b's talker start). The gate holds b while
    a's talker runs; a's last codec chunk may still be on its way when b's talker starts."""
    outs: dict[str, queue.Queue[OmniOutput]] = {rid: queue.Queue() for rid in "abt"}
    runtime.orchestrator.submit(_request("a"), outs["a"].put)
    while outs["a"].get(timeout=10).audio is None:
        pass
    runtime.orchestrator.submit(_request("b"), outs["b"].put)
    runtime.orchestrator.submit(_request("t", audio=False), outs["t"].put)  # text passes any gate
    for rid in "abt":
        while not outs[rid].get(timeout=20).finished:
            pass
    traces = {rid: runtime.orchestrator.trace(rid) for rid in "abt"}
    assert traces["t"].finished < traces["a"].finished
    return traces["a"].left["talker"], traces["b"].entered["talker"]


def test_a_new_stream_waits_while_it_would_push_the_running_one_past_real_time() -> None:
    runtime = _runtime(limit=0.9)
    try:
        a_done, b_started = _run_two(runtime)
    finally:
        runtime.close()
    assert b_started >= a_done  # held until a's talker finished


def test_without_the_gate_both_run_at_once() -> None:
    runtime = _runtime(limit=0.0)
    try:
        a_done, b_started = _run_two(runtime)
    finally:
        runtime.close()
    assert b_started < a_done  # the control: the fake talker really would have run both together


def test_a_held_request_can_be_aborted_and_frees_nothing_it_never_took() -> None:
    runtime = _runtime(limit=0.9)
    try:
        outs: dict[str, queue.Queue[OmniOutput]] = {rid: queue.Queue() for rid in "ab"}
        runtime.orchestrator.submit(_request("a"), outs["a"].put)
        while outs["a"].get(timeout=10).audio is None:
            pass
        runtime.orchestrator.submit(_request("b"), outs["b"].put)
        runtime.orchestrator.abort("b")
        ended = outs["b"].get(timeout=5)
        assert ended.finished and ended.finish_reason is FinishReason.ABORT
        assert not any(rid == "b" for worker in fakes.INSTANCES for _, rid in worker.seen)  # never reached a stage
        while not outs["a"].get(timeout=20).finished:
            pass
        assert not runtime.orchestrator.flows.waiting and not runtime.orchestrator.flows.states
    finally:
        runtime.close()


def test_a_burst_ramps_up_one_measured_count_at_a_time() -> None:
    gate = AudioGate(limit=0.9, frame_s=FRAME_S)
    gate.observe(_paces(0.1))
    gate.observe(_paces(0.11, 0.11))  # a batched talker: the line says 8 streams would be fine
    assert gate.rtf(8, 8) < 0.9
    assert gate.admits(_streams(0.11, 0.11))  # one past the largest count measured
    assert not gate.admits(_streams(0.11, 0.11, None))  # the third is not measured yet: no fourth
    assert not gate.admits(_streams(0.11, 0.11, 0.11))  # measured, but not recorded at 3 streams yet
    gate.observe(_paces(0.12, 0.12, 0.12))
    assert gate.admits(_streams(0.12, 0.12, 0.12))


PROFILE = {1: 0.030, 2: 0.032, 4: 0.036, 8: 0.048}  # a batched talker's step seconds at startup


def test_step_profile_interpolates_and_extends_its_last_slope() -> None:
    profile = StepProfile.of(PROFILE)
    assert profile is not None
    assert [profile.at(n) for n in (0, 1, 3, 6, 8)] == pytest.approx([0.030, 0.030, 0.034, 0.042, 0.048])
    assert profile.at(16) == pytest.approx(0.048 + 8 * 0.003)  # along 4 -> 8
    flat = StepProfile.of({1: 0.05, 4: 0.04})  # a falling last segment does not extrapolate down
    assert flat is not None and flat.at(10) == pytest.approx(0.04)
    assert StepProfile.of({}) is None and StepProfile.of({3: 0.0}) is None
    single = StepProfile.of({2: 0.02})
    assert single is not None and single.at(1) == single.at(9) == 0.02


def test_with_a_step_profile_a_burst_starts_in_doubling_rounds_while_it_predicts_room() -> None:
    gate = AudioGate(limit=0.92, frame_s=FRAME_S)
    gate.profile(PROFILE)
    assert gate.room(_streams(None)) == 0  # nothing measured while serving yet: the level is unknown
    gate.observe(_paces(0.5))
    assert gate.rtf(8, 8) == pytest.approx(0.5 * 0.048 / 0.030)
    assert gate.room(_streams(0.5, None)) == 0  # the second is in its prefill: its load is not measured yet
    loads, rounds = _streams(0.5), []
    while (room := gate.room(loads)) > 0:
        rounds.append(room)
        count = len(loads) + room  # the round measured at the level the profile predicted for it
        loads = _streams(*[0.5 * gate.talker_pace(count) / gate.talker_pace(1)] * count)
        gate.observe([load.talker_frame_s for load in loads if load.talking])
    # At most as many as are talking each round; 0.5 * step(n) / step(1): 0.90 at n = 10, 0.95 at 11
    assert rounds == [1, 2, 4, 2]
    assert len(loads) == 10
    assert AudioGate(limit=0.0, frame_s=FRAME_S).room(_streams(5.0, None)) > 100  # no gate: every waiting request starts


def test_without_a_step_profile_rounds_stay_one_stream() -> None:
    gate = AudioGate(limit=0.9, frame_s=FRAME_S)
    gate.observe(_paces(0.1))
    gate.observe(_paces(0.1, 0.1))
    assert gate.rtf(4, 4) < 0.5
    assert gate.room(_streams(0.1, 0.1)) == 1


def test_a_passing_slowdown_at_one_count_is_not_read_as_the_cost_of_a_stream() -> None:
    """The second stream's prefill slowed both: along two measured counts that reads as +0.4 a stream; the
    profile knows a stream adds 7%, so a third starts as soon as the measured level is back down."""
    plain, profiled = AudioGate(limit=0.9, frame_s=FRAME_S), AudioGate(limit=0.9, frame_s=FRAME_S)
    profiled.profile(PROFILE)
    for gate in (plain, profiled):
        gate.observe(_paces(0.5))
        gate.observe(_paces(0.85, 0.85))
    assert plain.rtf(3, 3) == pytest.approx(1.2)
    assert profiled.rtf(3, 3) == pytest.approx(0.85 * 0.034 / 0.032)
    assert not profiled.admits(_streams(0.85, 0.85))  # still too slow right now
    for _ in range(20):  # the prefill is over: the two streams run at their real pace again
        for gate in (plain, profiled):
            gate.observe(_paces(0.55, 0.55))
    assert profiled.admits(_streams(0.55, 0.55))


def test_far_below_the_limit_streams_start_without_waiting_for_each_others_prefill() -> None:
    gate = AudioGate(limit=0.9, frame_s=FRAME_S)
    gate.profile(PROFILE)
    gate.observe(_paces(0.1))  # a fast talker: ten streams are predicted at 0.18
    loads = _streams(0.1)
    while gate.admits(loads):
        loads.append(StreamLoad(True, None))
    # Admitted unmeasured while the prediction, doubled for the prefills, fits: 0.1 * step(n) / step(1) <= 0.45
    assert all(0.1 * StepProfile.of(PROFILE).at(n) / 0.030 * PREFILL_HEADROOM <= 0.9 for n in range(2, len(loads) + 1))
    assert 0.1 * StepProfile.of(PROFILE).at(len(loads) + 1) / 0.030 * PREFILL_HEADROOM > 0.9
    assert len(loads) > 20


def test_near_the_limit_a_stream_nearly_out_of_audio_holds_the_next_start() -> None:
    gate = AudioGate(limit=0.9, frame_s=FRAME_S)
    gate.profile(PROFILE)
    gate.observe(_paces(0.6, 0.6))
    pace = 0.6 * FRAME_S
    thin = [StreamLoad(True, pace, MIN_BUFFER_S / 2), StreamLoad(True, pace, 3.0)]
    thick = [StreamLoad(True, pace, 2.0), StreamLoad(True, pace, 3.0)]
    finished_talking = [StreamLoad(False, pace, 0.1), StreamLoad(True, pace, 3.0)]  # its talker is done
    unplayed = [StreamLoad(True, pace, None), StreamLoad(True, pace, 3.0)]  # not playing yet / consumed whole
    assert gate.rtf(3, 3) < 0.9 and gate.rtf(3, 3) * PREFILL_HEADROOM > 0.9
    assert not gate.admits(thin)
    assert gate.admits(thick) and gate.admits(finished_talking) and gate.admits(unplayed)
    fast = AudioGate(limit=0.9, frame_s=FRAME_S)
    fast.profile(PROFILE)
    fast.observe(_paces(0.1, 0.1))
    assert fast.admits([StreamLoad(True, 0.1 * FRAME_S, 0.1), StreamLoad(True, 0.1 * FRAME_S, 3.0)])  # far below


def test_the_real_talker_replica_hands_its_step_profile_to_the_gate(tiny_dir) -> None:  # noqa: ANN001
    """Started on the tiny checkpoint, the orchestrator's gate holds the talker replica's measured profile."""
    from omnistage.pipeline.engine import OmniPipeline
    from tests.pipeline.specs import small_spec

    pipeline = OmniPipeline(tiny_dir, small_spec(), PipelineOptions(in_process=True))
    try:
        steps = pipeline.runtime.orchestrator.flows.gate.step_profile
        assert steps is not None and [n for n, _ in steps.points] == [1, 2, 4, 8]
        assert all(s > 0 for _, s in steps.points)
    finally:
        pipeline.close()
