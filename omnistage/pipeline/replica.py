"""One stage replica: an engine loop fed by an input thread.

The input thread receives and decodes messages while the engine computes,
from the orchestrator and from peer replicas (a talker's chunks reach its codec
replica directly, on a socket the replica binds); the engine thread sends what
a pass produced itself, as soon as the pass ends: a stage's outputs are small
(tokens, notices, a chunk's audio through shared memory), and a queue and a
thread hop per message cost more than encoding it. The loop moves typed
messages between the inbox, the ``StageWorker`` and its sockets; a talker's
frames go through its :class:`CodecStreams` (cut into chunks, sent to the codec
replica, a notice for the orchestrator in their place). A pulse thread sends a
``Heartbeat`` carrying the loop's pass count every ``HEARTBEAT_S`` on its own
socket, so a long step never silences the replica, while a step that never ends
shows as a count that stops moving (``liveness.py``).
A replica runs in its own process (``ProcessReplica``), as threads of the
caller's process (``ThreadReplica``, tests and debugging) or in a Ray actor
(``RayReplica``, possibly on another machine); all run this loop.
"""

from __future__ import annotations

import logging
import math
import queue
import threading
import time
import traceback
from dataclasses import dataclass

import zmq

from omnistage.ipc.messages import (
    AbortRequests,
    ChunkOrders,
    Heartbeat,
    InputBatch,
    OpenCodecStream,
    PayloadTypes,
    ReplicaFailed,
    ReplicaInput,
    ReplicaLoad,
    ReplicaReady,
    RequestFailed,
    Shutdown,
    StageInput,
    StageOutput,
    StageTimes,
    StepBatch,
)
from omnistage.ipc.queues import Receiver, Sender
from omnistage.ipc.serialization import TensorStore
from omnistage.pipeline.codec_streams import CodecStreams
from omnistage.pipeline.heap_trim import IdleHeapTrim
from omnistage.pipeline.liveness import HEARTBEAT_S
from omnistage.pipeline.stage_clock import StageClock
from omnistage.pipeline.token_coalescer import TokenCoalescer
from omnistage.workers.base import StageWorker, WorkerFactory

logger = logging.getLogger(__name__)
IDLE_WAIT_S = 0.5  # an idle loop wakes this often to notice a stop request
FLUSH_MS = 2000  # how long a stopping replica may take to deliver its last messages
READY_WAIT_S = 10.0  # the peer socket is bound long before a model loads; this only bounds a broken bind


@dataclass(frozen=True)
class ReplicaAddresses:
    inputs: str  # orchestrator → replica
    outputs: str  # replica → orchestrator
    peer: str = ""  # other replicas → replica: bound by the replica (a TCP wildcard port on its own node)


class ReplicaLoop:
    def __init__(self, factory: WorkerFactory, ctx: zmq.Context, addresses: ReplicaAddresses,
                 store: TensorStore | None, pid: int, payloads: PayloadTypes, same_host: bool = True,
                 timed: bool = False, stream_interval_s: float = 0.0) -> None:
        self.factory = factory
        self.payloads = payloads
        self.ctx = ctx
        self.addresses = addresses
        self.store = store
        self.pid = pid
        self.same_host = same_host  # whether the orchestrator shares this machine (its ReplicaReady says so)
        self.stop = threading.Event()
        self.inbox: queue.Queue[ReplicaInput] = queue.Queue()
        self.passes = 0  # engine loop passes begun; the pulse thread reads it (an int: one atomic read)
        self.peer_address = ""  # the address the peer socket bound (set by the input thread)
        self._peer_bound = threading.Event()
        self._input_error = ""  # why the input thread could not open its sockets (the replica then fails)
        # Each request's times here, sent for its span (tracing on); None: nothing is timed.
        self.clock: StageClock | None = StageClock() if timed else None
        self.tokens = TokenCoalescer(stream_interval_s)
        self._last_load: ReplicaLoad | None = None  # the load last reported (``_report``)
        self._reported_at = -math.inf  # when the last message went out

    def run(self) -> None:
        """Runs until ``Shutdown`` arrives or the worker cannot be built; returns after the threads stop."""
        threads = [threading.Thread(target=self._input_thread, name="replica-in", daemon=True),
                   threading.Thread(target=self._pulse_thread, name="replica-pulse", daemon=True)]
        for t in threads:
            t.start()
        sender = Sender(self.ctx, self.addresses.outputs, self.payloads.replica_message(), self.store, bind=False)
        streams = CodecStreams(self.ctx, self.payloads)
        try:
            self._serve(sender, streams)
        finally:
            self.stop.set()
            streams.close()
            sender.close(linger_ms=FLUSH_MS)  # its last words (a failure, final outputs) still go out
            for t in threads:
                t.join(timeout=5)

    def _serve(self, sender: Sender, streams: CodecStreams) -> None:
        try:
            worker = self.factory()
            step_seconds = worker.step_profile()
        except Exception as exc:  # noqa: BLE001 - any load failure is reported, then the replica exits
            logger.exception("stage worker failed to start")
            sender.send(ReplicaFailed(f"{type(exc).__name__}: {exc}"))
            return
        if not self._peer_bound.wait(timeout=READY_WAIT_S) or self._input_error:
            sender.send(ReplicaFailed(self._input_error or "the input sockets did not open"))
            worker.close()
            return
        sender.send(ReplicaReady(worker.load(), self.pid, self.same_host, step_seconds, self.peer_address))
        try:
            self._engine_loop(worker, sender, streams)
        finally:
            worker.close()

    # Engine side -------------------------------------------------------------------------------
    def _engine_loop(self, worker: StageWorker, sender: Sender, streams: CodecStreams) -> None:
        busy = False
        heap = IdleHeapTrim()
        while not self.stop.is_set():
            self.passes += 1
            if not busy and self.inbox.empty():
                heap.idle()  # about to wait for work: what the last steps freed goes back to the system
            outputs: list[StageOutput | RequestFailed | StageTimes] = []
            for message in self._take_inputs(block=not busy):
                if isinstance(message, Shutdown):
                    return
                outputs += self._apply(worker, streams, message)
            busy = False
            if worker.has_work():
                busy = self._step(worker, streams, outputs)
            now = time.monotonic()
            outputs = self.tokens.take(outputs, now)
            if not busy:  # about to wait for work: nothing else would send what it holds
                outputs += self.tokens.flush(now)
            self._report(sender, streams, outputs, worker.load(), busy, now)

    def _report(self, sender: Sender, streams: CodecStreams, outputs: list[StageOutput | RequestFailed | StageTimes],
                load: ReplicaLoad, busy: bool, now: float) -> None:
        """Sends a pass's outputs with the plain frame notices held and the load. Notices and a changed load alone
        go at most once per stream interval, or when the loop is about to wait (a talker's message per step, for
        its notices, was most of the orchestrator's messages); with outputs they go along."""
        due = bool(outputs) or not busy or now - self._reported_at >= self.tokens.interval_s
        notes = streams.take_notes() if due else None
        if not (outputs or notes is not None or (due and load != self._last_load)):
            return
        if self.clock is not None:
            outputs = self.clock.outputs(outputs)
            if notes is not None:
                self.clock.noted(notes.request_ids)
        sender.send(StepBatch(outputs, load, notes))
        self._last_load, self._reported_at = load, now

    def _take_inputs(self, block: bool) -> list[ReplicaInput]:
        messages = []
        try:
            messages.append(self.inbox.get(timeout=IDLE_WAIT_S) if block else self.inbox.get_nowait())
            while True:
                messages.append(self.inbox.get_nowait())
        except queue.Empty:
            return messages

    def _apply(self, worker: StageWorker, streams: CodecStreams,
               message: ReplicaInput) -> list[StageOutput | RequestFailed | StageTimes]:
        if isinstance(message, InputBatch):
            return [out for item in message.items for out in self._apply(worker, streams, item)]
        if isinstance(message, AbortRequests):
            worker.abort(message.request_ids)
            streams.abort(message.request_ids)
            self.tokens.drop(message.request_ids)
            return self.clock.aborted(message.request_ids) if self.clock is not None else []
        rid = getattr(message, "request_id", "")
        if self.clock is not None and isinstance(message, StageInput):
            self.clock.received(rid)
        try:
            if isinstance(message, OpenCodecStream):
                streams.open(message)
                return []
            if isinstance(message, ChunkOrders):
                return streams.order(message)
            return streams.on_outputs(worker.handle(message))
        except Exception as exc:  # noqa: BLE001 - a bad input fails its request, not the replica
            logger.exception("stage input failed")
            worker.abort([rid])
            streams.abort([rid])
            self.tokens.drop([rid])
            return [RequestFailed(rid, f"{type(exc).__name__}: {exc}")]

    def _step(self, worker: StageWorker, streams: CodecStreams,
              outputs: list[StageOutput | RequestFailed | StageTimes]) -> bool:
        began = time.time_ns() if self.clock is not None else 0
        try:
            result = worker.step()
        except Exception as exc:  # noqa: BLE001 - the requests in the failed batch are failed, the loop goes on
            logger.error("stage step failed:\n%s", traceback.format_exc())
            held = worker.request_ids()
            worker.abort(held)
            streams.abort(held)
            self.tokens.drop(held)
            outputs.extend(RequestFailed(rid, f"{type(exc).__name__}: {exc}") for rid in held)
            return False
        if self.clock is not None:
            self.clock.stepped(worker.scheduled_ids(), began)
        outputs.extend(streams.on_outputs(result.outputs))
        return result.progressed

    # I/O threads --------------------------------------------------------------------------------
    def _input_thread(self) -> None:
        """Reads the orchestrator's socket and the peer socket (other replicas' stage inputs)."""
        sockets: list[Receiver] = []
        try:
            sockets.append(Receiver(self.ctx, self.addresses.inputs, self.payloads.replica_input(), self.store,
                                    bind=False))
            if self.addresses.peer:
                # Peers send only small chunk jobs, in the message frames (never shared memory).
                peer = Receiver(self.ctx, self.addresses.peer, self.payloads.replica_input(), None, bind=True)
                sockets.append(peer)
                self.peer_address = peer.address
        except Exception as exc:  # noqa: BLE001 - e.g. the peer address taken: the replica reports it and exits
            logger.exception("replica input sockets failed to open")
            self._input_error = f"{type(exc).__name__}: {exc}"
            for receiver in sockets:
                receiver.close()
            return
        finally:
            self._peer_bound.set()
        poller = zmq.Poller()
        for receiver in sockets:
            poller.register(receiver.socket, zmq.POLLIN)
        try:
            while not self.stop.is_set():
                ready = dict(poller.poll(int(IDLE_WAIT_S * 1000)))
                for receiver in sockets:
                    if receiver.socket not in ready:
                        continue
                    for message in receiver.drain():
                        self.inbox.put(message)
                        if isinstance(message, Shutdown):
                            return  # nothing after it matters; returning now spares the shutdown an idle wait
        finally:
            for receiver in sockets:
                receiver.close()

    def _pulse_thread(self) -> None:
        # Its own thread and socket, so a long step cannot delay it; the pass count it carries tells a long step
        # (the count moves between beats over time) from one that never ends (it stops).
        sender = Sender(self.ctx, self.addresses.outputs, self.payloads.replica_message(), None, bind=False)
        try:
            while not self.stop.wait(HEARTBEAT_S):
                sender.send(Heartbeat(self.passes))
        finally:
            sender.close()
