"""Every message of the orchestrator ↔ replica boundary survives a round trip, tensors included."""

from __future__ import annotations

import msgspec
import pytest
import torch
import zmq

from omnistage.engine.frame_chunker import ChunkPlan
from omnistage.engine.generation_engine import ChunkJob, StreamVoice
from omnistage.engine.request import FinishReason, MultimodalSpan
from omnistage.families.qwen3_omni.payloads import PAYLOADS, PromptHidden, TalkerStart, TextFeed, ThinkerPrompt
from omnistage.ipc.messages import (
    AbortRequests,
    ChunkOrder,
    ChunkOrders,
    FrameNotes,
    Heartbeat,
    InputBatch,
    OpenCodecStream,
    PayloadTypes,
    ReplicaFailed,
    ReplicaLoad,
    ReplicaReady,
    RequestFailed,
    Shutdown,
    StageInput,
    StageOutput,
    StepBatch,
)
from omnistage.ipc.payloads import GENERIC_PAYLOADS, AudioChunk, ChunkCut, CodecFrames, FramesMade, TokenDelta
from omnistage.ipc.queues import AddressBook, Receiver, Sender, next_address
from omnistage.ipc.serialization import MessageCodec
from omnistage.models.qwen3_omni.inputs import MultimodalInputs, PromptLayout
from omnistage.pipeline.connectors import InprocConnector, ShmConnector, shm_available
from omnistage.sampling_params import SamplingParams

# Tensors wrapped on received (read-only) frames are only read; torch warns about that once.
pytestmark = pytest.mark.filterwarnings("ignore:The given buffer is not writable")
TYPES = GENERIC_PAYLOADS + PAYLOADS  # a Qwen3-Omni pipeline's payload set
ReplicaInput, ReplicaMessage = TYPES.replica_input(), TYPES.replica_message()
SAMPLING = SamplingParams(temperature=0.7, top_k=5, seed=3, max_tokens=9, stop_token_ids=(1, 2))
INPUTS = [
    StageInput("a", ThinkerPrompt([1, 2, 3], SAMPLING, MultimodalInputs(
        input_features=torch.randn(1, 8, 100), feature_attention_mask=torch.ones(1, 100, dtype=torch.int32)),
        capture_hidden=True)),
    StageInput("b", ThinkerPrompt([4], SamplingParams())),
    StageInput("a", TalkerStart(PromptLayout([1, 2], audio_lengths=torch.tensor([100])), 7, "ethan", SAMPLING,
                                mm_hidden=torch.randn(30, 64, dtype=torch.bfloat16),
                                thinker_items=(MultimodalSpan(1, 31, bytes(range(32))),))),
    StageInput("a", TextFeed([5, 6], finished=True)),
    StageInput("a", ChunkJob("a", 2, torch.randint(0, 64, (4, 35)), left_context=25, is_last=True)),
    StageInput("a", ChunkJob("a", 0, torch.randn(32, 12), 0, slack_s=0.4, discard_frames=3, lookahead=2)),
    StageInput("a", ChunkJob("a", 0, torch.randint(0, 64, (1, 40)), 0, lookahead=24, voice=StreamVoice("Ethan", 3))),
    OpenCodecStream("a", "tcp://10.0.0.2:5555", ChunkPlan(25, 0, 10, lookahead=2), True, 8, 0.04,
                    delays=tuple(range(1, 9)), prime=torch.randint(0, 64, (8, 30))),
    OpenCodecStream("b", "ipc:///tmp/x", ChunkPlan(25, 4), False, 32, 0.08, latent=True, voice=StreamVoice("", 5)),
    ChunkOrders([ChunkOrder("a", 3, 12, 0.75, 2.4), ChunkOrder("b", 1, None, None, 0.0)]),
    AbortRequests(["a", "b"]),
    InputBatch([OpenCodecStream("c", "inproc://x", ChunkPlan(8, 0), True, 2, 0.08), StageInput("c", TextFeed([1])),
                AbortRequests(["d"]), ChunkOrders([ChunkOrder("c", 1, 4, None, 0.0)])]),
    Shutdown(),
]
OUTPUTS = [
    StepBatch([StageOutput("a", PromptHidden(torch.randn(2, 16), (MultimodalSpan(3, 5, bytes(32)),))),
               StageOutput("a", TokenDelta([5], num_prompt_tokens=3)),
               StageOutput("a", CodecFrames(torch.randint(0, 64, (1, 4))), finished=True,
                           finish_reason=FinishReason.STOP),
               StageOutput("a", AudioChunk(0, torch.randn(48000))), RequestFailed("b", "boom"),
               StageOutput("a", FramesMade(1, 3, [ChunkCut(0, 10, 10), ChunkCut(1, 4, 6, is_last=True)]), True)],
              ReplicaLoad(1, 2, 3, 4)),
    StepBatch([StageOutput("a", FramesMade(0, 0, []), True)], ReplicaLoad(), FrameNotes(["b", "c"], [1, 2], [5, 0])),
    ReplicaReady(ReplicaLoad(kv_blocks_total=10), pid=42),
    ReplicaReady(ReplicaLoad(), pid=7, step_seconds={1: 0.031, 2: 0.0325, 8: 0.048}, peer_address="ipc:///tmp/p"),
    ReplicaFailed("out of memory"),
    Heartbeat(passes=12),
]


def test_payload_sets_need_unique_tags() -> None:
    class Twin(msgspec.Struct, tag="tokens"):  # the generic TokenDelta's tag
        x: int

    with pytest.raises(ValueError, match="unique msgspec tags"):
        GENERIC_PAYLOADS + PayloadTypes((Twin,))


def test_a_payload_outside_the_set_is_refused_on_decode() -> None:
    class Stranger(msgspec.Struct, tag="stranger"):
        x: int

    frames = MessageCodec(ReplicaInput).encode(StageInput("a", Stranger(1)))
    with pytest.raises(msgspec.ValidationError):
        MessageCodec(ReplicaInput).decode(frames)


def test_sampling_params_are_checked_when_decoded() -> None:
    body = msgspec.msgpack.encode({"type": "StageInput", "request_id": "a", "payload": {
        "type": "qwen3_omni.ThinkerPrompt", "token_ids": [1], "sampling": {"top_p": 3.0}}})
    with pytest.raises(msgspec.ValidationError, match="top_p"):
        MessageCodec(ReplicaInput).decode([body])


def _equal(a: object, b: object) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, msgspec.Struct):
        return type(a) is type(b) and all(_equal(getattr(a, f), getattr(b, f)) for f in a.__struct_fields__)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b))
    return a == b


def _stores() -> list[object]:
    stores = [None, InprocConnector("t")]
    if shm_available():
        stores.append(ShmConnector("t", min_bytes=1024))
    return stores


@pytest.mark.parametrize("store", _stores(), ids=lambda s: type(s).__name__)
@pytest.mark.parametrize("message", INPUTS + OUTPUTS, ids=lambda m: type(m).__name__)
def test_round_trip(message: msgspec.Struct, store: object) -> None:
    kind = ReplicaInput if any(message is m for m in INPUTS) else ReplicaMessage
    codec = MessageCodec(kind, store)
    frames = codec.encode(message)
    # Bytes on the wire: what a zmq receiver hands the decoder.
    decoded = codec.decode([bytes(f) for f in frames])
    assert _equal(message, decoded)


def test_large_tensors_leave_the_body() -> None:
    wav = torch.randn(48000)
    frames = MessageCodec(ReplicaMessage).encode(StepBatch([StageOutput("a", AudioChunk(0, wav))], ReplicaLoad()))
    assert len(frames) == 2 and len(frames[0]) < 400  # the samples travel as their own frame
    assert len(frames[1]) == wav.numel() * 4


@pytest.mark.skipif(not shm_available(), reason="needs /dev/shm")
def test_shm_segment_is_removed_once_read() -> None:
    store = ShmConnector("cleanup-test", min_bytes=16)
    key = store.put(torch.arange(100, dtype=torch.float32))
    tensor = store.get(key, torch.float32, (100,))
    assert torch.equal(tensor, torch.arange(100, dtype=torch.float32))
    assert not list(__import__("pathlib").Path("/dev/shm").glob("omnistage-cleanup-test-*"))


def test_messages_cross_a_zmq_pipe() -> None:
    ctx = zmq.Context()
    book = AddressBook(in_process=False)
    try:
        address = book.new("pipe")
        rx = Receiver(ctx, address, ReplicaInput, None, bind=True)
        tx = Sender(ctx, address, ReplicaInput, None, bind=False)
        for message in INPUTS:
            tx.send(message)
        got = [rx.recv(timeout_ms=2000) for _ in INPUTS]
        assert all(_equal(a, b) for a, b in zip(INPUTS, got))
        assert rx.recv(timeout_ms=10) is None and rx.drain() == []
        tx.close()
        rx.close()
    finally:
        ctx.destroy(linger=0)
        book.cleanup()


def test_messages_cross_a_tcp_pipe_at_the_bound_port() -> None:
    # The Ray backend's pipes: the orchestrator binds a wildcard port and tells the replica the bound address.
    ctx = zmq.Context()
    book = AddressBook(in_process=False, tcp_host="127.0.0.1")
    try:
        assert book.folder is None and book.new("pipe") == "tcp://127.0.0.1:*"
        rx = Receiver(ctx, book.new("pipe"), ReplicaInput, None, bind=True)
        assert rx.address.startswith("tcp://127.0.0.1:") and not rx.address.endswith("*")
        tx = Sender(ctx, rx.address, ReplicaInput, None, bind=False)
        for message in INPUTS:
            tx.send(message)
        got = [rx.recv(timeout_ms=2000) for _ in INPUTS]
        assert all(_equal(a, b) for a, b in zip(INPUTS, got))
        assert next_address(rx.address, 3) == "tcp://127.0.0.1:*"
        assert next_address("ipc:///tmp/x/talker-0-in~0", 1) == "ipc:///tmp/x/talker-0-in~1"
        tx.close()
        rx.close()
    finally:
        ctx.destroy(linger=0)
        book.cleanup()


def test_a_message_that_does_not_decode_is_dropped_and_the_rest_are_read() -> None:
    ctx = zmq.Context()
    try:
        rx = Receiver(ctx, "inproc://undecodable", ReplicaInput, None, bind=True)
        tx = Sender(ctx, "inproc://undecodable", ReplicaInput, None, bind=False)
        raw = ctx.socket(zmq.PUSH)
        raw.connect("inproc://undecodable")
        tx.send(AbortRequests(["a"]))
        raw.send(b"\x81\xa4type\xa4nope")  # a map whose tag names no message
        tx.send(AbortRequests(["b"]))
        received: list = []
        for _ in range(100):
            received += rx.drain()
            if len(received) == 2:
                break
            rx.socket.poll(10)
        assert [m.request_ids for m in received] == [["a"], ["b"]]
        raw.close(linger=0)
        tx.close()
        rx.close()
    finally:
        ctx.destroy(linger=0)
