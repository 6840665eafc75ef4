"""The orchestrator and replica loops with fake stages (no models): routing, streaming, aborts, failures."""

from __future__ import annotations

import queue
import time

import numpy as np
import pytest

from omnistage.config.pipeline import parse_pipeline
from omnistage.core import FinishReason, Modality, OmniOutput, OmniRequest
from omnistage.pipeline.runtime import PipelineOptions, PipelineRuntime
from omnistage.families.qwen3_omni.prompt import Qwen3OmniPrompt
from omnistage.sampling_params import SamplingParams
from tests.pipeline import fakes
from tests.pipeline.specs import small_dict, small_spec

AUDIO = frozenset({Modality.TEXT, Modality.AUDIO})


def _request(rid: str, max_tokens: int = 6, audio: bool = True) -> OmniRequest:
    return OmniRequest(rid, Qwen3OmniPrompt([1, 2, 3]), AUDIO if audio else frozenset({Modality.TEXT}),
                       SamplingParams(max_tokens=max_tokens))


def _collect(outputs: queue.Queue, timeout: float = 10.0) -> list[OmniOutput]:
    got = [outputs.get(timeout=timeout)]
    while not got[-1].finished:
        got.append(outputs.get(timeout=timeout))
    return got


@pytest.fixture
def runtime():
    fakes.INSTANCES.clear()
    spec = parse_pipeline(small_dict(talker_replicas=2, talker_frames=10, gated=False))
    # Every token its own message (no stream interval): placement is checked over a request's many talker feeds.
    rt = PipelineRuntime(fakes.omni_graph(spec), fakes.fake_factories(0.001, 0.001), None, fakes.AUDIO,
                         PipelineOptions(in_process=True, stream_interval_ms=0))
    yield rt
    rt.close()


def test_text_and_audio_stream_in_order(runtime: PipelineRuntime) -> None:
    outputs: queue.Queue = queue.Queue()
    runtime.orchestrator.submit(_request("a"), outputs.put)
    got = _collect(outputs)
    assert [t for o in got for t in o.token_ids] == [101, 102, 103, 104, 105, 106]
    audio = np.concatenate([o.audio for o in got if o.audio is not None])
    # Frame k's code is k; each frame becomes 4 samples; chunks came back whole and in order.
    assert audio.tolist() == np.repeat(np.arange(1, 11), fakes.SAMPLES_PER_FRAME).astype(np.float32).tolist()
    assert got[-1].finish_reason is FinishReason.LENGTH and got[-1].usage.completion_tokens == 6
    trace = runtime.orchestrator.trace("a")
    assert trace.entered["talker"] <= trace.left["thinker"]  # the talker started on the first token


def test_least_loaded_talker_and_sticky_placement(runtime: PipelineRuntime) -> None:
    outputs = {rid: queue.Queue() for rid in "abc"}
    for rid in "ab":
        runtime.orchestrator.submit(_request(rid, max_tokens=8), outputs[rid].put)
    for rid in "ab":
        _collect(outputs[rid])
    runtime.orchestrator.submit(_request("c", max_tokens=8), outputs["c"].put)
    _collect(outputs["c"])
    placed = {rid: runtime.orchestrator.trace(rid).replicas["talker"] for rid in "abc"}
    assert placed["a"] != placed["b"]  # spread: b went to the idle replica
    assert placed["c"] == 0  # both idle again: ties go to the lowest index
    # Every talker message of a request (start, each text feed) reached the same worker.
    talkers = [w for w in fakes.INSTANCES if isinstance(w, fakes.FakeTalker)]
    holders = {rid: {id(w) for w in talkers for _, r in w.seen if r == rid} for rid in "abc"}
    assert all(len(h) == 1 for h in holders.values())
    assert all(sum(r == rid for _, r in w.seen) > 2 for rid in "abc" for w in talkers if id(w) in holders[rid])


def test_abort_frees_every_stage(runtime: PipelineRuntime) -> None:
    outputs: queue.Queue = queue.Queue()
    runtime.orchestrator.submit(_request("long", max_tokens=10_000), outputs.put)
    while outputs.get(timeout=10).audio is None:
        pass  # wait until the request runs in all three stages
    runtime.orchestrator.abort("long")
    runtime.orchestrator.abort("long")  # idempotent
    runtime.orchestrator.abort("unknown")
    while not (last := outputs.get(timeout=10)).finished:
        pass
    assert last.finish_reason is FinishReason.ABORT
    deadline = time.monotonic() + 5
    while any(r.kv_blocks_used or r.running for r in runtime.orchestrator.stats().replicas):
        assert time.monotonic() < deadline, runtime.orchestrator.stats()
        time.sleep(0.01)
    aborted = {type(w).__name__ for w in fakes.INSTANCES if ("abort", "long") in w.seen}
    assert aborted == {"FakeThinker", "FakeTalker", "FakeCode2Wav"}


def test_failed_stage_input_fails_only_its_request(runtime: PipelineRuntime) -> None:
    outputs: queue.Queue = queue.Queue()
    bad = OmniRequest("bad", Qwen3OmniPrompt([1]), AUDIO, SamplingParams(max_tokens=3))
    good = _request("good", max_tokens=3)
    thinker = next(w for w in fakes.INSTANCES if isinstance(w, fakes.FakeThinker))
    thinker.fail_on = "bad"
    runtime.orchestrator.submit(bad, outputs.put)
    runtime.orchestrator.submit(good, outputs.put)
    finals = {}
    while len(finals) < 2:
        out = outputs.get(timeout=10)
        if out.finished:
            finals[out.request_id] = out
    assert finals["bad"].finish_reason is FinishReason.ERROR and "boom" in finals["bad"].error
    assert finals["good"].finish_reason is FinishReason.LENGTH
    assert runtime.orchestrator.health().healthy


def test_text_only_pipeline_rejects_audio_requests() -> None:
    data = small_dict()
    data["stages"], data["edges"] = data["stages"][:1], []
    rt = PipelineRuntime(fakes.omni_graph(parse_pipeline(data)), fakes.fake_factories(), None, fakes.AUDIO,
                         PipelineOptions(in_process=True))
    try:
        outputs: queue.Queue = queue.Queue()
        rt.orchestrator.submit(_request("t", audio=False, max_tokens=2), outputs.put)
        assert _collect(outputs)[-1].finish_reason is FinishReason.LENGTH
        rt.orchestrator.submit(_request("a"), outputs.put)
        assert "no stage that makes audio" in _collect(outputs)[-1].error
    finally:
        rt.close()


def test_a_broken_step_fails_its_requests_and_the_replica_serves_on() -> None:
    rt = PipelineRuntime(fakes.omni_graph(small_spec()), fakes.fake_factories(crash_on="crash"), None, fakes.AUDIO,
                         PipelineOptions(in_process=True))
    try:
        outputs: queue.Queue = queue.Queue()
        rt.orchestrator.submit(_request("crash", audio=False), outputs.put)
        assert "step crashed" in _collect(outputs)[-1].error
        rt.orchestrator.submit(_request("after", audio=False, max_tokens=2), outputs.put)
        assert _collect(outputs)[-1].finish_reason is FinishReason.LENGTH
    finally:
        rt.close()


def test_a_replica_that_cannot_load_stops_the_start() -> None:
    from omnistage.pipeline.orchestrator import PipelineStartError

    factories = {**fakes.fake_factories(), "talker": fakes.broken_factory}
    with pytest.raises(PipelineStartError, match=r"'talker' replica 0 failed to start: OSError: weights not found"):
        PipelineRuntime(fakes.omni_graph(small_spec()), factories, None, fakes.AUDIO, PipelineOptions(in_process=True))


def test_initial_chunk_grows_with_load() -> None:
    from omnistage.config.pipeline import StreamingSpec
    from omnistage.pipeline.codec_edge import initial_chunk_frames

    streaming = StreamingSpec(codec_chunk_frames=25, initial_codec_chunk_frames=5)
    assert initial_chunk_frames(streaming, None, busy=0, capacity=10) == 5
    assert initial_chunk_frames(streaming, None, busy=5, capacity=10) == 15
    assert initial_chunk_frames(streaming, None, busy=50, capacity=10) == 25
    assert initial_chunk_frames(streaming, 2, busy=50, capacity=10) == 2  # the request's own choice wins


def test_a_head_start_halves_the_first_chunk_at_any_load() -> None:
    """A reply played only from some later moment (a speculative one) has frames in hand when its player starts:
    half the unloaded first chunk, however many streams are in flight (others' first chunks grow with them)."""
    from omnistage.config.pipeline import StreamingSpec
    from omnistage.pipeline.codec_edge import initial_chunk_frames

    streaming = StreamingSpec(codec_chunk_frames=25, initial_codec_chunk_frames=10)
    assert initial_chunk_frames(streaming, None, busy=0, capacity=10, head_start=True) == 5
    assert initial_chunk_frames(streaming, None, busy=0, capacity=10) == 10
    assert initial_chunk_frames(streaming, None, busy=4, capacity=10) == 16
    assert initial_chunk_frames(streaming, None, busy=4, capacity=10, head_start=True) == 5
    assert initial_chunk_frames(streaming, None, busy=50, capacity=10) == 25
    assert initial_chunk_frames(streaming, None, busy=50, capacity=10, head_start=True) == 5
    assert initial_chunk_frames(streaming, 3, busy=0, capacity=10, head_start=True) == 3  # asked for: as asked
    one = StreamingSpec(codec_chunk_frames=25, initial_codec_chunk_frames=1)
    assert initial_chunk_frames(one, None, busy=0, capacity=10, head_start=True) == 1


def test_router_places_least_loaded_healthy_and_sticks() -> None:
    from omnistage.pipeline.router import NoHealthyReplica, StageRouter

    router = StageRouter("talker", 3)
    assert [router.place(r) for r in "abc"] == [0, 1, 2]
    router.release("b")
    assert router.place("d") == 1 and router.place("a") == 0  # d fills the gap; a stays where it is
    router.healthy[0] = False
    router.release("a")
    assert router.place("e") == 1  # replica 0 is idle but unhealthy
    router.healthy[1] = router.healthy[2] = False
    with pytest.raises(NoHealthyReplica):
        router.place("f")


def test_close_ends_requests_in_flight() -> None:
    rt = PipelineRuntime(fakes.omni_graph(small_spec()), fakes.fake_factories(thinker_step_s=0.01), None, fakes.AUDIO,
                         PipelineOptions(in_process=True))
    outputs: queue.Queue = queue.Queue()
    rt.orchestrator.submit(_request("busy", max_tokens=10_000), outputs.put)
    outputs.get(timeout=10)
    rt.close()
    final = _collect(outputs)[-1]
    assert final.finish_reason is FinishReason.ERROR and "shut down" in final.error
    with pytest.raises(RuntimeError, match="shut down"):
        rt.orchestrator.submit(_request("late"), outputs.put)


def test_every_stage_replicated_serves_concurrent_requests() -> None:
    data = small_dict(talker_replicas=2, talker_frames=10, gated=False)
    data["stages"][0]["replicas"] = data["stages"][2]["replicas"] = 2
    # A talker as fast as the thinker would let a request leave code2wav before the next one's first chunk arrives
    # on a loaded host: each talker replica's batch makes its requests' frames in the same steps, 10 ms apart.
    rt = PipelineRuntime(fakes.omni_graph(parse_pipeline(data)), fakes.fake_factories(0.001, 0.01), None,
                         fakes.AUDIO, PipelineOptions(in_process=True))
    try:
        outputs = {f"r{i}": queue.Queue() for i in range(6)}
        for rid, q in outputs.items():
            rt.orchestrator.submit(_request(rid, max_tokens=6), q.put)
        for q in outputs.values():
            got = _collect(q)
            audio = np.concatenate([o.audio for o in got if o.audio is not None])
            assert audio.tolist() == np.repeat(np.arange(1, 11), fakes.SAMPLES_PER_FRAME).astype(np.float32).tolist()
        used = {stage: {rt.orchestrator.trace(rid).replicas[stage] for rid in outputs}
                for stage in ("thinker", "talker", "code2wav")}
        assert used == {"thinker": {0, 1}, "talker": {0, 1}, "code2wav": {0, 1}}
    finally:
        rt.close()


def test_a_reply_with_a_head_start_gets_a_smaller_first_chunk() -> None:
    """A request that starts before ``OmniRequest.plays_at`` has a head start: its first chunk is the smallest that
    covers the second at the paces the first two measured (frame k's code is k, 4 samples each; the fakes are quick,
    so under the 8 a reply played at once starts with: ``test_codec_streams`` for the sizes); one whose player starts
    at once (None, or a moment already past) does not."""
    fakes.INSTANCES.clear()
    spec = parse_pipeline(small_dict(talker_frames=10, gated=False, initial_chunk=8, chunk=9))
    rt = PipelineRuntime(fakes.omni_graph(spec), fakes.fake_factories(), None, fakes.AUDIO,
                         PipelineOptions(in_process=True))
    try:
        firsts = []
        for rid, plays_in in (("plain", None), ("past", -1.0), ("held", 60.0)):
            outputs: queue.Queue = queue.Queue()
            plays_at = None if plays_in is None else time.monotonic() + plays_in
            request = OmniRequest(rid, Qwen3OmniPrompt([1, 2, 3]), AUDIO, SamplingParams(max_tokens=6),
                                  plays_at=plays_at)
            rt.orchestrator.submit(request, outputs.put)
            chunks = [o.audio for o in _collect(outputs) if o.audio is not None]
            firsts.append(len(chunks[0]) // fakes.SAMPLES_PER_FRAME)
    finally:
        rt.close()
    assert firsts[:2] == [8, 8] and 1 <= firsts[2] < 8


@pytest.mark.parametrize("held_plays_in", [0.005, 60.0])
def test_a_reply_held_by_the_gate_past_its_head_start_loses_it(held_plays_in: float) -> None:
    """Two replies with a head start at once: the gate starts the first alone (half the first chunk) and holds the
    second until the first is measured (at least one 10 ms talker step). Held past the moment its player starts
    (5 ms on), it gets the first chunk of its load (one stream in flight: 6 frames beside a CPU's codec batch of 2),
    not half of it; released before that moment (60 s on), it keeps its head start (a smaller chunk)."""
    from omnistage.engine.generation_engine import vocoder_batch_cap
    from omnistage.pipeline.codec_edge import initial_chunk_frames

    spec = parse_pipeline(small_dict(talker_frames=24, initial_chunk=4, chunk=8))
    codec = next(stage for stage in spec.stages if stage.name == "code2wav")
    loaded = initial_chunk_frames(spec.streaming, None, 1, vocoder_batch_cap(codec.engine, codec.device))
    rt = PipelineRuntime(fakes.omni_graph(spec), fakes.fake_factories(talker_step_s=0.01), None, fakes.AUDIO,
                         PipelineOptions(in_process=True))
    try:
        queues = {rid: queue.Queue() for rid in ("first", "held")}
        for rid, q in queues.items():
            plays_at = time.monotonic() + (60.0 if rid == "first" else held_plays_in)
            rt.orchestrator.submit(OmniRequest(rid, Qwen3OmniPrompt([1, 2, 3]), AUDIO, SamplingParams(max_tokens=6),
                                               plays_at=plays_at), q.put)
        firsts = {rid: [o.audio for o in _collect(q) if o.audio is not None][0] for rid, q in queues.items()}
        held = rt.orchestrator.trace("held")
        first = rt.orchestrator.trace("first")
    finally:
        rt.close()
    assert held.arrival >= first.first_frames  # it waited at the gate
    assert loaded > 2
    frames = {rid: len(wav) // fakes.SAMPLES_PER_FRAME for rid, wav in firsts.items()}
    assert frames["first"] == 2  # nothing measured yet: half the unloaded chunk
    # Its head start kept: the smallest chunk the first's paces cover, under its load's (test_codec_streams).
    assert frames["held"] == loaded if held_plays_in < 1 else 1 <= frames["held"] < loaded
