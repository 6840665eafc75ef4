"""No head-of-line blocking: one orchestrator pass drains every ready message of every replica.

The replicas here are bare sockets the test writes to, so the backlog is
exact: a thousand internal messages (a talker's notices of the frames it made and
cut for code2wav itself) queued ahead of one audio chunk must not keep that chunk
from its caller for more than the one pass.
"""

from __future__ import annotations

import time

import pytest
import torch
import zmq

from omnistage.core import Modality, OmniOutput, OmniRequest
from omnistage.families.qwen3_omni.payloads import PAYLOADS
from omnistage.ipc.messages import FrameNotes, ReplicaLoad, StageOutput, StepBatch
from omnistage.ipc.payloads import GENERIC_PAYLOADS, AudioChunk, ChunkCut, FramesMade, TokenDelta
from omnistage.ipc.queues import AddressBook, Receiver, Sender
from omnistage.pipeline.flow import FlowSettings
from omnistage.pipeline.launcher import ReplicaHandle
from omnistage.pipeline.orchestrator import Orchestrator, ReplicaLink
from omnistage.families.qwen3_omni.prompt import Qwen3OmniPrompt
from omnistage.sampling_params import SamplingParams
from tests.pipeline.fakes import AUDIO, omni_graph
from tests.pipeline.specs import small_spec

BACKLOG = 1000
TYPES = GENERIC_PAYLOADS + PAYLOADS
ReplicaInput, ReplicaMessage = TYPES.replica_input(), TYPES.replica_message()


class _Manual(ReplicaHandle):
    def start(self) -> None: ...

    def is_alive(self) -> bool:
        return True

    def join(self, timeout: float) -> bool:
        return True

    def kill(self) -> None: ...


class _Peer:
    """The replica end of one link, driven by the test."""

    def __init__(self, ctx: zmq.Context, out_address: str, in_address: str) -> None:
        self.out = Sender(ctx, out_address, ReplicaMessage, None, bind=False)
        self.inbox = Receiver(ctx, in_address, ReplicaInput, None, bind=False)


@pytest.fixture
def rig():
    ctx, book = zmq.Context(), AddressBook(in_process=True)
    spec = small_spec()
    links, peers = [], {}
    for stage in spec.stage_names:
        ins, outs = book.new(f"{stage}-in"), book.new(f"{stage}-out")
        links.append(ReplicaLink(stage, 0, _Manual(None), Sender(ctx, ins, ReplicaInput, None, bind=True),
                                 Receiver(ctx, outs, ReplicaMessage, None, bind=True), ready=True))
        peers[stage] = _Peer(ctx, outs, ins)
    orch = Orchestrator(FlowSettings(omni_graph(spec), AUDIO), links, None, ctx)
    yield orch, peers
    orch.close_sockets()
    for peer in peers.values():
        peer.out.close()
        peer.inbox.close()
    ctx.destroy(linger=0)


def _batch(*outputs: object) -> StepBatch:
    return StepBatch(list(outputs), ReplicaLoad())


def test_ready_audio_reaches_caller_in_one_pass_behind_a_backlog(rig) -> None:
    orch, peers = rig
    delivered: list[OmniOutput] = []
    request = OmniRequest("r", Qwen3OmniPrompt([1, 2, 3]), frozenset({Modality.TEXT, Modality.AUDIO}),
                          SamplingParams(max_tokens=4))
    orch.submit(request, delivered.append)
    orch.poll_once(timeout_ms=1000)
    peers["thinker"].out.send(_batch(StageOutput("r", TokenDelta([7], num_prompt_tokens=3))))
    orch.poll_once(timeout_ms=1000)  # the talker is started with the first token
    [batch] = peers["talker"].inbox.drain()  # one message a pass
    started = [type(getattr(m, "payload", m)).__name__ for m in batch.items]
    assert started == ["OpenCodecStream", "TalkerStart"]  # where to send its chunks, before its first input
    delivered.clear()

    for k in range(BACKLOG):
        cuts = [ChunkCut(k // 10, 10, 10)] if k % 10 == 9 else []
        peers["talker"].out.send(_batch(StageOutput("r", FramesMade(1, k % 10 + 1 if not cuts else 1, cuts))))
    peers["code2wav"].out.send(_batch(StageOutput("r", AudioChunk(0, torch.ones(480)))))
    time.sleep(0.2)  # every message is queued at the orchestrator before the pass starts

    handled = orch.poll_once(timeout_ms=0)
    assert handled == BACKLOG + 1
    assert [o.audio.shape for o in delivered if o.audio is not None] == [(480,)]
    # The notices were planned in the same pass: the talker got its orders, in one message; code2wav got nothing
    # from the orchestrator (chunks go to it from the talker).
    orders = peers["talker"].inbox.drain()
    assert [type(m).__name__ for m in orders] == ["ChunkOrders"] and orders[0].orders
    assert peers["code2wav"].inbox.drain() == []


def test_a_pass_never_waits_on_an_idle_stage(rig) -> None:
    orch, peers = rig
    peers["code2wav"].out.send(_batch())  # only the last stage has anything to say
    start = time.monotonic()
    assert orch.poll_once(timeout_ms=5000) == 1
    assert time.monotonic() - start < 1.0


def _start(orch: Orchestrator, peers: dict[str, _Peer], rid: str) -> None:
    request = OmniRequest(rid, Qwen3OmniPrompt([1, 2, 3]), frozenset({Modality.TEXT, Modality.AUDIO}),
                          SamplingParams(max_tokens=4))
    orch.submit(request, lambda out: None)
    orch.poll_once(timeout_ms=1000)
    peers["thinker"].out.send(_batch(StageOutput(rid, TokenDelta([7], num_prompt_tokens=3))))
    orch.poll_once(timeout_ms=1000)
    peers["talker"].inbox.drain()


def test_a_steps_plain_notices_in_one_message_plan_as_their_outputs_would(rig) -> None:
    """A talker sends its plain notices (frames, no cut) as a step's ``FrameNotes``: the orchestrator counts the
    frames, measures the pace and orders chunks exactly as it does from ``FramesMade`` outputs."""
    orch, peers = rig
    orch.flows.gate.limit = 0  # both streams start at once
    _start(orch, peers, "out")
    _start(orch, peers, "noted")
    for k in range(60):
        cuts = [ChunkCut(k // 10, 10, 10)] if k % 10 == 9 else []
        pending = k % 10 + 1 if not cuts else 1
        notice = StageOutput("out", FramesMade(1, pending, cuts))
        noted = StageOutput("noted", FramesMade(1, pending, cuts))
        notes = None if cuts else FrameNotes(["noted"], [1], [pending])
        peers["talker"].out.send(StepBatch([notice, noted] if cuts else [notice], ReplicaLoad(), notes))
        assert orch.poll_once(timeout_ms=1000) == 1
    orders = [o for batch in peers["talker"].inbox.drain() for o in batch.orders]
    by_request = {rid: [o.index for o in orders if o.request_id == rid] for rid in ("out", "noted")}
    assert by_request["noted"] == by_request["out"] and by_request["out"]
    out, noted = (orch.flows.states[rid] for rid in ("out", "noted"))
    assert noted.audio.chunks_sent == out.audio.chunks_sent == 6
    assert noted.trace.first_frames is not None and noted.audio.planner.talker.value is not None


class _BrokenPlanner:
    def frames_arrived(self, now: float, count: int) -> None:
        raise RuntimeError("planner broke")


def test_a_notice_whose_planning_fails_fails_its_request_alone(rig) -> None:
    """A step's notices are planned in one call: one stream's failure fails that request, and the streams noted
    after it in the same step are still planned."""
    orch, peers = rig
    orch.flows.gate.limit = 0
    delivered: dict[str, list[OmniOutput]] = {}
    for rid in ("a", "broken", "b"):
        delivered[rid] = []
        orch.submit(OmniRequest(rid, Qwen3OmniPrompt([1, 2, 3]), frozenset({Modality.TEXT, Modality.AUDIO}),
                                SamplingParams(max_tokens=4)), delivered[rid].append)
        orch.poll_once(timeout_ms=1000)
        peers["thinker"].out.send(_batch(StageOutput(rid, TokenDelta([7], num_prompt_tokens=3))))
        orch.poll_once(timeout_ms=1000)
    peers["talker"].inbox.drain()
    orch.flows.states["broken"].audio.planner = _BrokenPlanner()
    peers["talker"].out.send(StepBatch([], ReplicaLoad(), FrameNotes(["a", "broken", "b"], [1, 1, 1], [1, 1, 1])))
    orch.poll_once(timeout_ms=1000)
    [failed] = [o for o in delivered["broken"] if o.finished]
    assert "planner broke" in (failed.error or "") and "broken" not in orch.flows.states
    for rid in ("a", "b"):
        assert orch.flows.states[rid].trace.first_frames is not None
        assert not any(o.finished for o in delivered[rid])
