"""A talker replica's codec streams: its frames cut into chunks here and sent straight to the codec replica.

The orchestrator opens a stream per request (:class:`OpenCodecStream`: the codec replica's address, the chunk
plan, the family's frame) and keeps planning it: its :class:`ChunkOrder`\\ s say how many frames the next chunk
takes (from the caller's player and the measured paces) and where that player stands. Here each talker step's
frames go through the request's :class:`FrameChunker`; every chunk it cuts goes to the codec replica as a
``StageInput[ChunkJob]`` on a socket this replica owns, carrying the slack its player has left (the codec's
deadline order); the chunks one call cut for one codec replica go as one message (an ``InputBatch``: a send, with
its I/O thread's wake-up, costs more than encoding a chunk), and the orchestrator gets only a :class:`FramesMade`
notice in place of the frames. A notice that cut nothing and ends nothing (most of them: one per frame) waits
among the plain notes, merged per request, until the replica's loop takes them (``take_notes``: at most once per
stream interval, or with a message going anyway); a request's notice that goes out carries the frames noted before
it. Frames of a request with no stream (a family's own edge, a prefill-only request) pass through unchanged.

Everything runs on the replica's engine thread (the sockets are used by that thread only).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import zmq

from omnistage.engine.frame_chunker import FrameChunker
from omnistage.engine.generation_engine import ChunkJob
from omnistage.ipc.messages import (
    ChunkOrder,
    ChunkOrders,
    FrameNotes,
    InputBatch,
    OpenCodecStream,
    PayloadTypes,
    RequestFailed,
    StageInput,
    StageOutput,
)
from omnistage.ipc.payloads import ChunkCut, CodecFrames, FramesMade
from omnistage.ipc.queues import Sender
from omnistage.pipeline.playback import Playback

logger = logging.getLogger(__name__)
# A player not started yet cannot run dry: a chunk for it is given this much slack (``Playback.deadline``).
STARTUP_SLACK_S = 1.0
LINGER_MS = 1000  # a closed socket's last chunks still go out (a codec replica that died takes none)


@dataclass
class _Order:
    """The newest chunk size the orchestrator gave: chunk ``index`` takes ``frames``. Any other chunk waits for
    its size (an order for a chunk already cut came too late and is ignored)."""

    index: int
    frames: int

    def size(self, chunk_index: int, pending: int) -> int | None:
        return self.frames if chunk_index == self.index else None

    def update(self, index: int, frames: int) -> None:
        if index >= self.index:
            self.index, self.frames = index, frames


@dataclass
class _Stream:
    chunker: FrameChunker
    address: str
    frame_s: float
    playback: Playback = field(default_factory=Playback)
    sent_s: float = 0.0  # audio in chunks sent so far
    frames_made: int = 0


class CodecStreams:
    def __init__(self, ctx: zmq.Context, payloads: PayloadTypes, clock: Callable[[], float] = time.monotonic) -> None:
        self.ctx, self.payloads, self.clock = ctx, payloads, clock
        self.streams: dict[str, _Stream] = {}
        self._senders: dict[str, Sender] = {}  # codec replica address → this thread's socket to it
        self._noted: dict[str, list[int]] = {}  # plain notices not sent yet: request → [new frames, pending]
        self._outbox: dict[str, list[StageInput]] = {}  # codec address -> chunk jobs cut, not sent yet (``_flush``)

    def open(self, message: OpenCodecStream) -> None:
        """A request's frames will be cut here (sent before its first input, so before its first frame)."""
        planner = _Order(0, message.plan.size(0)) if message.planned else None
        dtype = torch.float32 if message.latent else torch.long
        chunker = FrameChunker(message.request_id, message.plan, message.width, planner, message.prime,
                               message.delays, dtype, message.voice)
        if message.codec_address not in self._senders:
            self._forget_idle_senders()  # e.g. a restarted codec replica's old address
        self.streams[message.request_id] = _Stream(chunker, message.codec_address, message.frame_s)
        self._sender(message.codec_address)

    def order(self, orders: ChunkOrders) -> list[StageOutput | RequestFailed]:
        """Applies the orchestrator's plan; a chunk its new size allows now is cut at once."""
        outputs = []
        now = self.clock()
        for order in orders.orders:
            stream = self.streams.get(order.request_id)
            if stream is None:
                continue  # finished or aborted here while the order was on its way
            self._sync(stream, order, now)
            try:
                cuts = self._send(stream, stream.chunker.cut(), now)
            except Exception as exc:  # noqa: BLE001 - as in ``_guarded``
                logger.exception("codec stream of %s failed", order.request_id)
                self._end(order.request_id)
                outputs.append(RequestFailed(order.request_id, f"{type(exc).__name__}: {exc}"))
                continue
            if cuts:
                outputs.append(StageOutput(order.request_id, FramesMade(self._unnoted(order.request_id),
                                                                        stream.chunker.num_pending, cuts)))
        return self._flush(outputs)

    def on_outputs(self, outputs: list[StageOutput | RequestFailed]) -> list[StageOutput | RequestFailed]:
        """A step's outputs with every streamed request's frames cut and sent, a notice in their place: one that
        cut a chunk or ends the stream as an output, a plain one (new frames only) among the pass's notes
        (``take_notes``). A failed request's stream ends here: the orchestrator aborts it in the codec stage."""
        for out in outputs:
            if isinstance(out, RequestFailed):
                self._end(out.request_id)
        kept: list[StageOutput | RequestFailed] = []
        for out in outputs:
            if isinstance(out, StageOutput) and out.request_id in self.streams \
                    and (isinstance(out.payload, CodecFrames) or out.finished):
                out = self._guarded(out)
                if out is None:
                    continue
            kept.append(out)
        return self._flush(kept)

    def take_notes(self) -> FrameNotes | None:
        """The plain notices held, merged per request, for the pass's ``StepBatch`` (None: there are none)."""
        if not self._noted:
            return None
        notes = FrameNotes(list(self._noted), [n[0] for n in self._noted.values()],
                           [n[1] for n in self._noted.values()])
        self._noted.clear()
        return notes

    def abort(self, request_ids: list[str]) -> None:
        for rid in request_ids:
            self._end(rid)

    def close(self) -> None:
        for sender in self._senders.values():
            sender.close(linger_ms=LINGER_MS)
        self._senders.clear()

    # Internals ------------------------------------------------------------------------------------
    def _end(self, request_id: str) -> None:
        self.streams.pop(request_id, None)
        self._noted.pop(request_id, None)

    def _unnoted(self, request_id: str) -> int:
        """The request's frames noted and not sent yet: its notice that goes out now carries them."""
        noted = self._noted.pop(request_id, None)
        return 0 if noted is None else noted[0]

    def _guarded(self, out: StageOutput) -> StageOutput | RequestFailed | None:
        """A stream that cannot go on (frames of the wrong width...) fails its request alone. None: its notice
        went to the notes."""
        try:
            return self._cut(out)
        except Exception as exc:  # noqa: BLE001 - one request's broken stream must not end the replica
            logger.exception("codec stream of %s failed", out.request_id)
            self._end(out.request_id)
            return RequestFailed(out.request_id, f"{type(exc).__name__}: {exc}")

    def _cut(self, out: StageOutput) -> StageOutput | None:
        stream = self.streams[out.request_id]
        now = self.clock()
        frames = out.payload.frames if isinstance(out.payload, CodecFrames) else None
        count = 0 if frames is None else frames.shape[0]
        jobs = stream.chunker.push(frames) if count else []
        if out.finished:
            jobs += stream.chunker.finish()
            del self.streams[out.request_id]
        stream.frames_made += count
        cuts = self._send(stream, jobs, now)
        if not cuts and not out.finished:
            noted = self._noted.get(out.request_id)
            if noted is None:
                self._noted[out.request_id] = [count, stream.chunker.num_pending]
            else:
                noted[0] += count
                noted[1] = stream.chunker.num_pending
            return None
        notice = FramesMade(count + self._unnoted(out.request_id), stream.chunker.num_pending, cuts)
        return StageOutput(out.request_id, notice, out.finished, out.finish_reason)

    def _send(self, stream: _Stream, jobs: list[ChunkJob], now: float) -> list[ChunkCut]:
        """Queues the jobs for their codec replica (``_flush`` sends them); what was cut."""
        cuts = []
        outbox = self._outbox.setdefault(stream.address, []) if jobs else []
        for job in jobs:
            job.slack_s = stream.playback.deadline(now, STARTUP_SLACK_S) - now
            outbox.append(StageInput(job.request_id, job))
            seconds = job.new_frames * stream.frame_s
            stream.playback.sent(seconds)
            stream.sent_s += seconds
            cuts.append(ChunkCut(job.chunk_index, job.new_frames, job.codes.shape[1], job.is_last))
        return cuts

    def _flush(self, outputs: list[StageOutput | RequestFailed]) -> list[StageOutput | RequestFailed]:
        """Sends each codec replica the jobs queued for it as one message; a send that fails fails its requests
        (the notices of their cuts are replaced)."""
        failed: dict[str, RequestFailed] = {}
        for address, jobs in self._outbox.items():
            try:
                self._sender(address).send(jobs[0] if len(jobs) == 1 else InputBatch(list(jobs)))
            except Exception as exc:  # noqa: BLE001 - as in ``_guarded``: the replica goes on
                logger.exception("codec stream send to %s failed", address)
                for job in jobs:
                    self._end(job.request_id)
                    failed[job.request_id] = RequestFailed(job.request_id, f"{type(exc).__name__}: {exc}")
        self._outbox.clear()
        if not failed:
            return outputs
        return [out for out in outputs if out.request_id not in failed] + list(failed.values())

    @staticmethod
    def _sync(stream: _Stream, order: ChunkOrder, now: float) -> None:
        """The orchestrator's view of the player, on this clock: it plays until ``play_end_in_s`` from now, and
        what this replica sent but the caller has not got yet is in flight."""
        if order.frames is not None and isinstance(stream.chunker.sizer, _Order):
            stream.chunker.sizer.update(order.index, order.frames)
        playback = stream.playback
        playback.play_end = None if order.play_end_in_s is None else now + order.play_end_in_s
        playback.in_flight_s = max(0.0, stream.sent_s - order.delivered_s)

    def _forget_idle_senders(self) -> None:
        """Closes the sockets no open stream uses, letting what they still hold go out for a while."""
        live = {stream.address for stream in self.streams.values()}
        for address in [a for a in self._senders if a not in live]:
            self._senders.pop(address).close(linger_ms=LINGER_MS)

    def _sender(self, address: str) -> Sender:
        sender = self._senders.get(address)
        if sender is None:
            # Chunk jobs are small: they travel in the message frames (no shared memory, any machine).
            sender = self._senders[address] = Sender(self.ctx, address, self.payloads.replica_input(), None,
                                                     bind=False)
        return sender
