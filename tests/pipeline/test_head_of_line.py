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
from omnistage.ipc.messages import ReplicaLoad, StageOutput, StepBatch
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


def test_a_talkers_cut_notices_count_and_measure_its_frames_and_order_nothing_until_audio_is_heard(rig) -> None:
    """A talker sizes its chunks itself and tells the orchestrator only of its cuts (each with the frames made since
    the last): the orchestrator counts the frames and measures the talker's pace from them; only audio reaching the
    caller makes it tell the talker anything (where the player stands)."""
    orch, peers = rig
    _start(orch, peers, "r")
    for k in range(6):
        peers["talker"].out.send(_batch(StageOutput("r", FramesMade(10, 1, [ChunkCut(k, 10, 10)]))))
        assert orch.poll_once(timeout_ms=1000) == 1
    assert peers["talker"].inbox.drain() == []
    state = orch.flows.states["r"]
    assert state.audio.chunks_sent == 6 and state.trace.first_frames is not None
    assert state.audio.planner.talker.value is not None
    peers["code2wav"].out.send(_batch(StageOutput("r", AudioChunk(0, torch.ones(480)))))
    assert orch.poll_once(timeout_ms=1000) == 1
    [orders] = peers["talker"].inbox.drain()
    [order] = orders.orders
    assert order.request_id == "r" and order.play_end_in_s is not None and order.delivered_s > 0
