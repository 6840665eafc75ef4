"""Each replica's view of its requests (tracing on): what it times, in which order its times leave, and that a
pipeline without a trace sink times nothing."""

from __future__ import annotations

import queue

import pytest
import torch

from omnistage.config.pipeline import parse_pipeline
from omnistage.core import Modality, OmniOutput, OmniRequest
from omnistage.families.qwen3_omni.prompt import Qwen3OmniPrompt
from omnistage.ipc.messages import RequestFailed, StageOutput, StageTimes
from omnistage.ipc.payloads import AudioChunk, TokenDelta
from omnistage.pipeline.request_state import RequestTrace
from omnistage.pipeline.runtime import PipelineOptions, PipelineRuntime
from omnistage.pipeline.stage_clock import MAX_HELD, StageClock
from omnistage.sampling_params import SamplingParams
from tests.pipeline import fakes
from tests.pipeline.specs import small_dict

AUDIO = frozenset({Modality.TEXT, Modality.AUDIO})


def test_times_leave_just_before_the_last_output_and_count_steps_and_outputs() -> None:
    clock = StageClock()
    clock.received("a")
    clock.received("a")  # a later input of the same request: still its first arrival
    first = clock.held["a"].received_ns
    clock.stepped(["a", "unknown"], began_ns=first + 5)
    clock.stepped(["a"], began_ns=first + 9)
    middle = clock.outputs([StageOutput("a", TokenDelta([1]))])
    assert [type(o) for o in middle] == [StageOutput]
    last = clock.outputs([StageOutput("a", TokenDelta([2]), finished=True)])
    assert [type(o) for o in last] == [StageTimes, StageOutput]  # the times first: they arrive before the end
    times = last[0]
    assert (times.request_id, times.scheduled_ns, times.steps, times.outputs) == ("a", first + 5, 2, 2)
    assert first <= times.first_output_ns <= times.finished_ns and not times.aborted
    assert clock.held == {}


def test_a_talkers_frame_notes_count_as_its_outputs() -> None:
    """Plain frame notices travel as a step's ``FrameNotes``, not as outputs: they still count, and the first one
    is the request's first output there."""
    clock = StageClock()
    clock.received("a")
    clock.noted(["a", "unknown"])
    noted_at = clock.held["a"].first_output_ns
    assert noted_at and clock.held["a"].outputs == 1 and "unknown" not in clock.held
    [times, _] = clock.outputs([StageOutput("a", TokenDelta([2]), finished=True)])
    assert (times.outputs, times.first_output_ns) == (2, noted_at)


def test_an_abort_sends_the_times_held_and_a_failure_drops_them() -> None:
    clock = StageClock()
    for rid in "abc":
        clock.received(rid)
    aborted = clock.aborted(["a", "zzz"])
    assert [(t.request_id, t.aborted) for t in aborted] == [("a", True)] and aborted[0].finished_ns > 0
    assert clock.outputs([RequestFailed("b", "boom")]) == [RequestFailed("b", "boom")]
    assert list(clock.held) == ["c"] and clock.outputs([]) == []


def test_a_request_that_never_ends_here_is_forgotten_in_time() -> None:
    clock = StageClock()
    for i in range(MAX_HELD + 10):  # e.g. chunks a codec replica dropped after their request's abort
        clock.received(f"r{i}")
    assert len(clock.held) == MAX_HELD and next(iter(clock.held)) == "r10"


def _run(runtime: PipelineRuntime, rid: str) -> list[OmniOutput]:
    outputs: queue.Queue = queue.Queue()
    runtime.orchestrator.submit(OmniRequest(rid, Qwen3OmniPrompt([1, 2, 3]), AUDIO, SamplingParams(max_tokens=4),
                                            traceparent=f"00-{'1' * 32}-{'2' * 16}-01"), outputs.put)
    got = [outputs.get(timeout=10)]
    while not got[-1].finished:
        got.append(outputs.get(timeout=10))
    return got


@pytest.fixture
def traced() -> tuple[PipelineRuntime, list[tuple[OmniRequest, RequestTrace]]]:
    fakes.INSTANCES.clear()
    seen: list[tuple[OmniRequest, RequestTrace]] = []
    # Every token its own output (no stream interval): the thinker's count of outputs is its count of tokens.
    rt = PipelineRuntime(fakes.omni_graph(parse_pipeline(small_dict(talker_frames=6, gated=False))),
                         fakes.fake_factories(0.001, 0.001), None, fakes.AUDIO,
                         PipelineOptions(in_process=True, stream_interval_ms=0), trace_sink=lambda request, trace: seen.append((request, trace)))
    yield rt, seen
    rt.close()


def test_a_traced_pipeline_hands_each_finished_request_with_every_stage_timed(traced) -> None:  # noqa: ANN001
    runtime, seen = traced
    got = _run(runtime, "a")
    assert len(seen) == 1
    request, trace = seen[0]
    assert request.request_id == "a" and request.traceparent is not None
    assert set(trace.stage_times) == {"thinker", "talker", "code2wav"}  # every stage's times came before the end
    thinker, talker, code2wav = (trace.stage_times[s] for s in ("thinker", "talker", "code2wav"))
    assert thinker.received_ns <= talker.received_ns <= code2wav.received_ns
    assert thinker.outputs == 4 and thinker.finished_ns >= thinker.first_output_ns > 0
    chunks = sum(1 for o in got if o.audio is not None)
    assert code2wav.outputs == len(trace.chunks) == chunks and [c.stage for c in trace.chunks] == ["code2wav"] * chunks
    assert trace.usage is not None and trace.usage.completion_tokens == 4 and trace.reason is not None


def test_without_a_sink_no_replica_times_anything() -> None:
    fakes.INSTANCES.clear()
    rt = PipelineRuntime(fakes.omni_graph(parse_pipeline(small_dict(talker_frames=6, gated=False))),
                         fakes.fake_factories(0.001, 0.001), None, fakes.AUDIO, PipelineOptions(in_process=True))
    try:
        _run(rt, "a")
        assert all(link.handle.loop.clock is None for link in rt.orchestrator.links.values())
        trace = rt.orchestrator.trace("a")
        assert trace.stage_times == {} and trace.chunks == [] and trace.usage is None
    finally:
        rt.close()


def test_stage_times_cross_the_wire_with_a_step_batch() -> None:
    from omnistage.ipc.messages import ReplicaLoad, StepBatch
    from omnistage.ipc.payloads import GENERIC_PAYLOADS
    from omnistage.ipc.serialization import MessageCodec

    codec = MessageCodec(GENERIC_PAYLOADS.replica_message())
    times = StageTimes("a", 1, 2, 3, 4, 5, 6, aborted=True)
    batch = StepBatch([times, StageOutput("a", AudioChunk(0, torch.zeros(4)), finished=True)], ReplicaLoad())
    decoded = codec.decode(codec.encode(batch))
    assert decoded.outputs[0] == times and isinstance(decoded.outputs[1], StageOutput)
