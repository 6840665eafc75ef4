"""Chunks straight from talker to codec: the talker replica's side (cuts, sends, notices), the orchestrator's plan
(orders from notices and deliveries), and the codec worker dropping a chunk that overtook its request's abort."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import zmq

from omnistage.audio_spec import AudioSpec, Codebooks
from omnistage.config.pipeline import parse_pipeline
from omnistage.engine.frame_chunker import ChunkPlan
from omnistage.engine.generation_engine import ChunkJob
from omnistage.ipc.messages import (
    ChunkOrder,
    ChunkOrders,
    FrameNotes,
    InputBatch,
    OpenCodecStream,
    RequestFailed,
    StageInput,
    StageOutput,
)
from omnistage.ipc.payloads import GENERIC_PAYLOADS, AudioChunk, ChunkCut, CodecFrames, FramesMade
from omnistage.ipc.queues import Receiver
from omnistage.pipeline.chunk_planner import StagePaces
from omnistage.pipeline.codec_edge import CodecEdge, StreamSetup
from omnistage.pipeline.codec_streams import STARTUP_SLACK_S, CodecStreams
from omnistage.workers.base import WorkerSpec
from tests.pipeline.specs import small_dict
from tests.pipeline.toy_audio import HZ25_16K, ToyCodec

ADDRESS = "inproc://test-codec-peer"
AUDIO = AudioSpec(24000, 1920, Codebooks(2, 1024))


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def rig() -> Iterator[tuple[CodecStreams, Receiver, Clock]]:
    ctx = zmq.Context()
    codec = Receiver(ctx, ADDRESS, GENERIC_PAYLOADS.replica_input(), None, bind=True)
    clock = Clock()
    streams = CodecStreams(ctx, GENERIC_PAYLOADS, clock)
    yield streams, codec, clock
    streams.close()
    codec.close()
    ctx.destroy(linger=0)


def _open(streams: CodecStreams, rid: str = "r", planned: bool = True, first: int = 2) -> None:
    plan = ChunkPlan(chunk_frames=4, left_context=0, first_chunk_frames=first)
    streams.open(OpenCodecStream(rid, ADDRESS, plan, planned, 2, 0.08))


def _frames(rid: str, n: int, start: int = 0, finished: bool = False) -> StageOutput:
    return StageOutput(rid, CodecFrames(torch.arange(start, start + n).repeat(2, 1).T), finished)


def _messages(codec: Receiver) -> list[object]:
    messages = []
    for _ in range(50):  # inproc delivery is immediate, but give the pipe a moment
        messages += codec.drain()
        if messages:
            break
        codec.recv(timeout_ms=10)
    return messages


def _jobs(codec: Receiver) -> list[ChunkJob]:
    inputs = [item for m in _messages(codec) for item in (m.items if isinstance(m, InputBatch) else [m])]
    return [m.payload for m in inputs]


def test_the_talker_cuts_sends_and_tells_the_orchestrator_only_what_it_did(rig) -> None:
    streams, codec, clock = rig
    _open(streams)
    [out] = streams.on_outputs([_frames("r", 3)])
    assert isinstance(out.payload, FramesMade) and out.payload.count == 3 and out.payload.pending == 1
    assert out.payload.cuts == [ChunkCut(0, 2, 2)]
    [job] = _jobs(codec)
    assert job.codes[0].tolist() == [0, 1] and job.slack_s == pytest.approx(STARTUP_SLACK_S)  # not playing yet
    assert streams.take_notes() is None  # that notice cut a chunk: an output of its own
    # Chunk 1 waits for the orchestrator's size, then goes at once (the player: 0.5 s left, 0.1 s delivered). A
    # notice of frames alone goes among the pass's notes, every stream's in one message.
    assert streams.on_outputs([_frames("r", 3, start=3)]) == [] and _jobs(codec) == []
    assert streams.take_notes() == FrameNotes(["r"], [3], [4]) and streams.take_notes() is None
    clock.now += 1.0
    [notice] = streams.order(ChunkOrders([ChunkOrder("r", 1, 3, 0.5, 0.1)]))
    assert notice.payload == FramesMade(0, 1, [ChunkCut(1, 3, 3)])
    [job] = _jobs(codec)
    # Slack: the player's 0.5 s plus the audio sent and not yet delivered (2 frames = 0.16 s, less 0.1 s).
    assert job.codes[0].tolist() == [2, 3, 4] and job.slack_s == pytest.approx(0.5 + 0.16 - 0.1)
    [out] = streams.on_outputs([_frames("r", 1, start=6, finished=True)])
    assert out.finished and out.payload.cuts == [ChunkCut(2, 2, 2, is_last=True)] and not streams.streams
    assert _jobs(codec)[0].is_last


def test_notes_held_over_steps_merge_and_the_next_notice_carries_their_frames(rig) -> None:
    """Plain notices not taken yet (the replica sends them at most once per stream interval) merge per request:
    frames summed, the newest pending; a notice that goes out before them (a cut, an order's cut, the end) carries
    their frames, so the orchestrator counts every frame once; an aborted request's are dropped."""
    streams, codec, _ = rig
    for rid in ("a", "b", "gone"):
        _open(streams, rid, first=8)
    for step in range(3):
        assert streams.on_outputs([_frames(rid, 1, start=step) for rid in ("a", "b", "gone")]) == []
    streams.abort(["gone"])
    assert streams.take_notes() == FrameNotes(["a", "b"], [3, 3], [3, 3]) and streams.take_notes() is None
    assert streams.on_outputs([_frames("a", 2, start=3), _frames("b", 2, start=3)]) == []
    [out] = streams.on_outputs([_frames("a", 4, start=5)])  # 9 pending: chunk 0 (8 frames) is cut
    assert out.payload == FramesMade(6, 1, [ChunkCut(0, 8, 8)])  # the 2 held frames and this step's 4
    [cut] = streams.order(ChunkOrders([ChunkOrder("b", 0, 4, None, 0.0)]))  # b's 5 pending: 4 go
    assert cut.payload == FramesMade(2, 1, [ChunkCut(0, 4, 4)])  # b's 2 held frames
    [end] = streams.on_outputs([_frames("b", 1, start=5, finished=True)])
    assert end.payload.count == 1 and streams.take_notes() is None
    assert len(_jobs(codec)) >= 2


def test_the_chunks_one_pass_cut_go_to_the_codec_replica_as_one_message(rig) -> None:
    streams, codec, _ = rig
    _open(streams, "a", planned=False)
    _open(streams, "b", planned=False)
    outs = streams.on_outputs([_frames("a", 8), _frames("b", 2, finished=True)])
    assert [len(o.payload.cuts) for o in outs] == [2, 1]
    [message] = _messages(codec)
    assert isinstance(message, InputBatch)
    assert [(i.request_id, i.payload.chunk_index, i.payload.new_frames) for i in message.items] == [
        ("a", 0, 2), ("a", 1, 4), ("b", 0, 2)]
    [out] = streams.on_outputs([_frames("a", 4, start=8)])  # a single chunk goes alone
    [message] = _messages(codec)
    assert isinstance(message, StageInput) and message.payload.chunk_index == 2


def test_unplanned_streams_take_fixed_sizes_and_others_pass_through(rig) -> None:
    streams, codec, _ = rig
    _open(streams, planned=False)
    [out] = streams.on_outputs([_frames("r", 8)])
    assert [c.new_frames for c in out.payload.cuts] == [2, 4]  # the plan's first chunk, then its chunk size
    other = _frames("other", 2)
    assert streams.on_outputs([other]) == [other]  # no stream opened: the frames go to the orchestrator as they are
    streams.on_outputs([RequestFailed("r", "boom")])
    assert not streams.streams


def _edge(played: bool = True, paces: StagePaces | None = None, requested: int | None = None,
          head_start: bool = False) -> CodecEdge:
    spec = parse_pipeline(small_dict())
    setup = StreamSetup("talker", "code2wav", AUDIO, spec.streaming, spec.stage("code2wav"), played, busy=0,
                        requested_first=requested, head_start=head_start)
    return CodecEdge(setup, paces or StagePaces())


def test_a_slow_pipeline_opens_a_stream_with_a_first_chunk_that_covers_the_second_unless_one_was_asked() -> None:
    slow = StagePaces()  # what earlier streams measured: a talker at real time, a dear vocoder
    for pace, sample in ((slow.talker_frame_s, 0.08), (slow.vocoder_frame_s, 0.02), (slow.vocoder_chunk_s, 0.3)):
        pace.add(sample)
    configured = _edge().initial_chunk_frames
    grown = _edge(paces=slow)
    assert grown.initial_chunk_frames > configured and grown.plan.first_chunk_frames == grown.initial_chunk_frames
    assert grown.planner.size(0, 0) == grown.initial_chunk_frames
    assert _edge(paces=slow, requested=2).initial_chunk_frames == 2
    assert _edge(paces=slow, head_start=True).initial_chunk_frames <= configured


def _paces(talker: float, vocoder: float, call: float) -> StagePaces:
    paces = StagePaces()
    for pace, sample in ((paces.talker_frame_s, talker), (paces.vocoder_frame_s, vocoder), (paces.vocoder_chunk_s, call)):
        pace.add(sample)
    return paces


def test_a_head_start_alone_takes_the_smallest_first_chunk_covering_the_second_beside_others_at_least_half() -> None:
    """A speculative reply's first chunk: every frame less is a talker step less before the audio a user waits for.
    Alone it shrinks as far as the paces cover; beside other streams it keeps half the unloaded chunk at least and
    grows as a reply played at once would. 80 ms frames; unloaded first chunk 10, 25 once the codec's batch is busy."""
    spec = parse_pipeline(small_dict(initial_chunk=10, chunk=25))

    def first(paces: StagePaces, busy: int = 0) -> int:
        setup = StreamSetup("talker", "code2wav", AUDIO, spec.streaming, spec.stage("code2wav"), True, busy=busy,
                            head_start=True)
        edge = CodecEdge(setup, paces)
        assert edge.plan.first_chunk_frames == edge.initial_chunk_frames == edge.planner.size(0, 0)
        return edge.initial_chunk_frames

    assert first(StagePaces()) == first(StagePaces(), busy=3) == 5  # nothing measured: half the unloaded chunk
    quick = _paces(0.02, 0.005, 0.025)
    assert first(quick) == 3  # alone: the least a head start's first chunk takes (HEAD_START_MIN_S: 3 frames)
    assert first(_paces(0.001, 0.001, 0.002)) == 3
    assert first(quick, busy=1) == 5  # beside another stream: half at least
    # A talker at 60% of real time, a vocoder call of 160 ms: 3 frames (180 ms to play, less the 50 ms delivery
    # margin) do not cover the second chunk (3 frames, 3 x 48 ms + decode); 4 do.
    assert first(_paces(0.048, 0.004, 0.16)) == 4
    # Calls of 600 ms (a second chunk of 10 frames), a talker at 70% of real time: 11 frames cover it. Alone, the
    # head start keeps its half; beside 8 streams, a reply played at once would start with up to 25: 11.
    slow = _paces(0.056, 0.01, 0.6)
    assert first(slow) == 5
    assert first(slow, busy=8) == 11


def test_the_orchestrator_orders_the_next_chunk_once_it_heard_of_a_cut() -> None:
    edge = _edge()
    first = edge.initial_chunk_frames
    assert edge.frames_made("r", FramesMade(first, 0, []), False, 1.0) is None  # chunk 0's size is in the plan
    order = edge.frames_made("r", FramesMade(1, 1, [ChunkCut(0, first, first)]), False, 1.1)
    assert order is not None and order.index == 1 and order.frames is not None and order.play_end_in_s is None
    assert edge.frames_made("r", FramesMade(0, 1, []), False, 1.1) is None  # nothing changed: nothing said
    heard = edge.heard("r", AudioChunk(0, torch.zeros(first * 1920)), first * 0.08, 1.5)
    assert heard.play_end_in_s == pytest.approx(first * 0.08) and heard.delivered_s == pytest.approx(first * 0.08)
    assert edge.frames_made("r", FramesMade(0, 0, []), True, 2.0) is None and edge.talker_done


def test_an_unplayed_stream_gets_the_player_state_but_no_sizes() -> None:
    edge = _edge(played=False)
    order = edge.frames_made("r", FramesMade(3, 1, [ChunkCut(0, 2, 2)]), False, 1.0)
    assert order is not None and order.frames is None


def test_a_chunk_that_overtook_its_abort_is_dropped(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"toy_audio": {
        "name": HZ25_16K.name, "sample_rate": HZ25_16K.sample_rate, "samples_per_frame": HZ25_16K.samples_per_frame}}))
    worker = ToyCodec(WorkerSpec(str(tmp_path), parse_pipeline(small_dict()).stage("code2wav")))
    worker.abort(["r"])
    assert worker.handle(StageInput("r", ChunkJob("r", 0, torch.zeros(4, 2, dtype=torch.long), 0))) == []
    assert not worker.has_work() and worker.request_ids() == []
    worker.handle(StageInput("s", ChunkJob("s", 0, torch.zeros(4, 2, dtype=torch.long), 0, is_last=True)))
    [out] = worker.step().outputs
    assert out.request_id == "s" and out.finished and out.payload.wav.numel() == 2 * HZ25_16K.samples_per_frame


def test_a_broken_stream_fails_its_request_alone(rig) -> None:
    streams, _, _ = rig
    _open(streams, "bad")
    _open(streams, "good")
    wide = StageOutput("bad", CodecFrames(torch.zeros(3, 5, dtype=torch.long)))  # 5 codebooks, not 2
    failed, fine = streams.on_outputs([wide, _frames("good", 3)])
    assert isinstance(failed, RequestFailed) and failed.request_id == "bad" and "bad" not in streams.streams
    assert isinstance(fine.payload, FramesMade) and fine.payload.cuts


def test_a_replica_whose_peer_socket_cannot_open_says_so_and_exits() -> None:
    import threading

    from omnistage.ipc.messages import ReplicaFailed
    from omnistage.ipc.queues import Sender
    from omnistage.pipeline.replica import ReplicaAddresses, ReplicaLoop
    from tests.pipeline.fakes import FakeCode2Wav

    ctx = zmq.Context()
    try:
        inputs = Sender(ctx, "inproc://bad-peer-in", GENERIC_PAYLOADS.replica_input(), None, bind=True)
        outputs = Receiver(ctx, "inproc://bad-peer-out", GENERIC_PAYLOADS.replica_message(), None, bind=True)
        addresses = ReplicaAddresses(inputs.address, outputs.address, peer="tcp://no-such-host.invalid:*")
        loop = ReplicaLoop(FakeCode2Wav, ctx, addresses, None, 1, GENERIC_PAYLOADS)
        thread = threading.Thread(target=loop.run, daemon=True)
        thread.start()
        thread.join(timeout=30)
        assert not thread.is_alive()  # it returned: nothing would ever reach it
        messages = outputs.drain()
        failed = [m for m in messages if isinstance(m, ReplicaFailed)]
        assert failed and "ZMQError" in failed[0].error, messages
        inputs.close()
        outputs.close()
    finally:
        ctx.destroy(linger=0)
