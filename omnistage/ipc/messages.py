"""The messages between the orchestrator and a stage replica (the one process boundary of the pipeline).

Family-neutral envelopes around typed payloads: the orchestrator sends a
replica ``StageInput``s (a request's start or more input, as its payload says),
and a replica answers with ``ReplicaMessage``s whose ``StageOutput``s carry the
payloads its worker made. Payloads are msgspec structs with unique tags: the
generic ones of :mod:`omnistage.ipc.payloads` and those a model family
registers. msgspec decodes a union only of types it knows when the decoder is
built, so each pipeline builds its sockets' types from its payload set
(:class:`PayloadTypes`: ``StageInput[A | B | ...]``); a replica gets the same set
in its launch. Tensor fields travel out of band (``omnistage.ipc.serialization``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Generic, TypeVar, Union

import msgspec
import torch

from omnistage.engine.frame_chunker import ChunkPlan
from omnistage.engine.generation_engine import StreamVoice
from omnistage.engine.request import FinishReason

P = TypeVar("P")


# ---- orchestrator → replica -------------------------------------------------------------------
class StageInput(msgspec.Struct, Generic[P], tag=True):
    """A request's input at one stage: what starts it there, or more for it (the payload's type says which)."""

    request_id: str
    payload: P


class AbortRequests(msgspec.Struct, tag=True):
    request_ids: list[str]


class Shutdown(msgspec.Struct, tag=True):
    pass


class OpenCodecStream(msgspec.Struct, tag=True):
    """To a talker replica, before the request's first input there: cut this request's frames into chunks
    yourself and send them to the codec replica listening at ``codec_address`` (frames never come back to the
    orchestrator, only :class:`omnistage.ipc.payloads.FramesMade` notices).

    plan: chunk sizes (the first, then fixed ones unless ``planned``), left context and look-ahead.
    planned: later chunks wait for the orchestrator's :class:`ChunkOrder` sizes (its player-aware planner).
    width, delays, latent: the family's frame (codebooks or latent values per frame; codebook delays; float
        latents rather than integer codes).
    prime: ``[W, R]`` frames the stream decodes first without their audio (a cloned voice's reference).
    voice: the request's voice and seed, for a decoder conditioned per stream (sent with its first chunk).
    """

    request_id: str
    codec_address: str
    plan: ChunkPlan
    planned: bool
    width: int
    frame_s: float
    delays: tuple[int, ...] = ()
    latent: bool = False
    prime: torch.Tensor | None = None
    voice: StreamVoice | None = None


class ChunkOrder(msgspec.Struct, array_like=True):
    """The orchestrator's plan for one stream, as of sending: chunk ``index`` takes ``frames`` new frames (None:
    unchanged), the caller's player runs dry ``play_end_in_s`` from now (None: not playing yet), and
    ``delivered_s`` seconds of audio reached the caller so far (the talker knows what it sent)."""

    request_id: str
    index: int
    frames: int | None
    play_end_in_s: float | None
    delivered_s: float


class ChunkOrders(msgspec.Struct, tag=True):
    """Every order for one talker replica from one orchestrator pass."""

    orders: list[ChunkOrder]


class InputBatch(msgspec.Struct, Generic[P], tag=True):
    """Everything the orchestrator had for one replica in one pass, in the order it was sent: one message and one
    socket send, not one per input (at a few dozen streams, sending cost more than handling what was sent)."""

    items: list[StageInput[P] | AbortRequests | OpenCodecStream | ChunkOrders]


ReplicaInput = StageInput | AbortRequests | Shutdown | OpenCodecStream | ChunkOrders | InputBatch


# ---- replica → orchestrator -------------------------------------------------------------------
class ReplicaLoad(msgspec.Struct, frozen=True):
    waiting: int = 0
    running: int = 0
    kv_blocks_used: int = 0
    kv_blocks_total: int = 0
    kv_block_bytes: int = 0  # one block over all layers; the pool's bytes = (total + null block) * this
    graphs_captured: int = 0  # CUDA graph sets captured at start-up (decode, code predictor)
    graph_capture_failures: int = 0  # sets whose capture failed: those steps run eagerly


class StageOutput(msgspec.Struct, Generic[P], tag=True):
    """What a stage made for one request; ``finished`` on its last output there (the stage let it go)."""

    request_id: str
    payload: P | None = None
    finished: bool = False
    finish_reason: FinishReason | None = None


class RequestFailed(msgspec.Struct, tag=True):
    request_id: str
    error: str


class StageTimes(msgspec.Struct, tag=True):
    """When one replica held one request, in ``time.time_ns()`` (sent only by a replica launched ``timed``, when
    tracing is on: just before the request's last output there, or at its abort). Wall-clock nanoseconds because
    the orchestrator turns them into spans beside its own times: one host's processes share that clock, and
    hosts of one Ray cluster agree within their NTP error.

    received_ns: its first input reached the engine loop; scheduled_ns: the first engine step that computed for
    it began (0: the worker does not say, :meth:`StageWorker.scheduled_ids`); first_output_ns: its first output
    (an AR stage's first token: the prefill's end); finished_ns: its last output, or its abort.
    steps: engine steps that computed for it; outputs: outputs it sent (tokens, frame notices, audio chunks).
    """

    request_id: str
    received_ns: int
    scheduled_ns: int = 0
    first_output_ns: int = 0
    finished_ns: int = 0
    steps: int = 0
    outputs: int = 0
    aborted: bool = False


class FrameNotes(msgspec.Struct, array_like=True):
    """A talker's plain notices since its last report, every stream's in one: request ``request_ids[i]`` made
    ``counts[i]`` new frames and holds ``pendings[i]`` not in a chunk yet; none cut a chunk or ended (those go as
    :class:`omnistage.ipc.payloads.FramesMade` outputs). Most of an audio stream's notices are these, one per
    frame: merged per request and as columns they cost the orchestrator a loop turn each, not a decoded struct and
    an output's dispatch."""

    request_ids: list[str] = msgspec.field(default_factory=list)
    counts: list[int] = msgspec.field(default_factory=list)
    pendings: list[int] = msgspec.field(default_factory=list)

    def add(self, request_id: str, count: int, pending: int) -> None:
        self.request_ids.append(request_id)
        self.counts.append(count)
        self.pendings.append(pending)


class StepBatch(msgspec.Struct, Generic[P], tag=True):
    """Everything one pass of a replica's loop produced, with its load after the pass; ``notes``: the step's plain
    frame notices (a talker's; they follow the outputs)."""

    outputs: list[StageOutput[P] | RequestFailed | StageTimes]
    load: ReplicaLoad
    notes: FrameNotes | None = None


class ReplicaReady(msgspec.Struct, tag=True):
    load: ReplicaLoad
    pid: int
    # False when the replica runs on another machine (Ray): tensors for it must travel in the message
    # frames, since it cannot map this machine's shared memory.
    same_host: bool = True
    # Seconds of one decode step by batch size, measured before the first request (a talker's; empty when the
    # stage measured none): :mod:`omnistage.engine.step_profile`.
    step_seconds: dict[int, float] = msgspec.field(default_factory=dict)
    # Where other replicas send it stage inputs directly (a talker its chunks to a codec replica).
    peer_address: str = ""


class Heartbeat(msgspec.Struct, tag=True):
    """The replica is alive (its pulse thread sends one every ``HEARTBEAT_S``, whatever the engine is doing)."""

    passes: int  # engine loop passes begun so far: unchanged between beats for long means a step never ends


class ReplicaFailed(msgspec.Struct, tag=True):
    """The replica cannot go on (load failure, crashed loop); it exits after sending this."""

    error: str


ReplicaMessage = StepBatch | ReplicaReady | ReplicaFailed | Heartbeat


@dataclass(frozen=True)
class PayloadTypes:
    """The payload structs one pipeline's stages exchange; what its sockets decode. Picklable (classes travel
    by reference), so a replica in another process builds the same decoders."""

    members: tuple[type, ...]

    def __post_init__(self) -> None:
        tags = [m.__struct_config__.tag for m in self.members]
        if None in tags or len(set(tags)) != len(tags):
            raise ValueError(f"payloads need unique msgspec tags: {dict(zip(tags, self.members))}")

    def union(self) -> object:
        return Union[self.members]  # noqa: UP007 - built at run time from a tuple

    def replica_input(self) -> object:
        union = self.union()
        return Union[StageInput[union], AbortRequests, Shutdown, OpenCodecStream, ChunkOrders,  # noqa: UP007
                     InputBatch[union]]

    def replica_message(self) -> object:
        return Union[StepBatch[self.union()], ReplicaReady, ReplicaFailed, Heartbeat]  # noqa: UP007

    def __add__(self, other: PayloadTypes) -> PayloadTypes:
        return PayloadTypes(self.members + tuple(m for m in other.members if m not in self.members))
