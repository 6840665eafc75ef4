"""Admission that protects running streams: a new audio request waits while it would push them past real time."""

from __future__ import annotations

import queue

import pytest

from omnistage.config.pipeline import parse_pipeline
from omnistage.core import FinishReason, Modality, OmniOutput, OmniRequest, RequestSampling
from omnistage.pipeline.audio_gate import AudioGate, StreamLoad
from omnistage.pipeline.playback import FRAME_S
from omnistage.pipeline.runtime import PipelineOptions, PipelineRuntime
from omnistage.processing.prompt import ProcessedPrompt
from tests.pipeline import fakes
from tests.pipeline.specs import small_dict


def _streams(*rtfs: float | None) -> list[StreamLoad]:
    return [StreamLoad(None if r is None else r * FRAME_S) for r in rtfs]


def test_no_stream_running_always_admits_and_an_unknown_pace_waits() -> None:
    gate = AudioGate(limit=0.9)
    assert gate.admits([])
    assert not gate.admits(_streams(None))  # a stream started, its talker pace not measured yet
    assert AudioGate(limit=0.0).admits(_streams(5.0))  # no gate


def test_prediction_is_proportional_then_follows_what_was_measured() -> None:
    gate = AudioGate(limit=0.9)
    gate.observe(_streams(0.4))
    assert gate.predict(2) == pytest.approx(0.8)  # one count measured: a stage that does not batch
    assert gate.admits(_streams(0.4))
    gate.observe(_streams(0.5, 0.5))
    assert gate.predict(3) == pytest.approx(0.6)  # along the measured slope (batching)
    assert gate.admits(_streams(0.5, 0.5))
    assert not gate.admits(_streams(0.95, 0.95))  # already past the limit


def test_vocoder_load_scales_with_streams() -> None:
    gate = AudioGate(limit=0.9)
    gate.vocoded(busy_s=0.3, audio_s=1.0)  # 0.3 s of vocoder per second of audio
    assert gate.rtf(_streams(0.1, 0.1)) == pytest.approx(0.6)
    gate.observe(_streams(0.1, 0.1))
    assert gate.predict(3) == pytest.approx(0.9)
    assert not gate.admits(_streams(0.1, 0.1, 0.1))


def _request(rid: str, audio: bool = True) -> OmniRequest:
    modalities = frozenset({Modality.TEXT, Modality.AUDIO} if audio else {Modality.TEXT})
    return OmniRequest(rid, ProcessedPrompt([1, 2, 3]), modalities, RequestSampling(max_tokens=30))


def _runtime(limit: float) -> PipelineRuntime:
    """A talker whose step takes 55 ms per stream (it does not batch): one stream runs at 0.69x real time, two
    at 1.4x, so two at once would both underrun."""
    data = small_dict(talker_frames=30)
    data["streaming"]["admission_rtf_limit"] = limit
    fakes.INSTANCES.clear()
    return PipelineRuntime(parse_pipeline(data), fakes.fake_factories(0.001, talker_step_s_per_seq=0.055), None,
                           fakes.GROUPS, PipelineOptions(in_process=True))


def _run_two(runtime: PipelineRuntime) -> tuple[float, float]:
    """Starts a, then b once a is streaming; returns (a's finish, b's talker start)."""
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
    return traces["a"].finished, traces["b"].talker_start


def test_a_new_stream_waits_while_it_would_push_the_running_one_past_real_time() -> None:
    runtime = _runtime(limit=0.9)
    try:
        a_done, b_started = _run_two(runtime)
    finally:
        runtime.close()
    assert b_started >= a_done  # held until a finished


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
