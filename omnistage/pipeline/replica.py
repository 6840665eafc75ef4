"""One stage replica: an engine loop between an input thread and an output thread.

The input thread receives and decodes messages while the engine computes;
the output thread encodes and sends what a pass produced, so serialisation
overlaps the next step (vLLM v1's engine-core layout). The loop itself only
moves typed messages between two local queues and the ``StageWorker``. A
pulse thread sends a ``Heartbeat`` carrying the loop's pass count every
``HEARTBEAT_S``, so a long step never silences the replica, while a step that
never ends shows as a count that stops moving (``liveness.py``).
A replica runs in its own process (``ProcessReplica``), as threads of the
caller's process (``ThreadReplica``, tests and debugging) or in a Ray actor
(``RayReplica``, possibly on another machine); all run this loop.
"""

from __future__ import annotations

import logging
import queue
import threading
import traceback
from dataclasses import dataclass

import zmq

from omnistage.ipc.messages import (
    AbortRequests,
    Heartbeat,
    PayloadTypes,
    ReplicaFailed,
    ReplicaInput,
    ReplicaLoad,
    ReplicaMessage,
    ReplicaReady,
    RequestFailed,
    Shutdown,
    StageOutput,
    StepBatch,
)
from omnistage.ipc.queues import Receiver, Sender
from omnistage.ipc.serialization import TensorStore
from omnistage.pipeline.liveness import HEARTBEAT_S
from omnistage.workers.base import StageWorker, WorkerFactory

logger = logging.getLogger(__name__)
IDLE_WAIT_S = 0.5  # an idle loop wakes this often to notice a stop request
FLUSH_MS = 2000  # how long a stopping replica may take to deliver its last messages
_STOP = object()


@dataclass(frozen=True)
class ReplicaAddresses:
    inputs: str  # orchestrator → replica
    outputs: str  # replica → orchestrator


class ReplicaLoop:
    def __init__(self, factory: WorkerFactory, ctx: zmq.Context, addresses: ReplicaAddresses,
                 store: TensorStore | None, pid: int, payloads: PayloadTypes, same_host: bool = True) -> None:
        self.factory = factory
        self.payloads = payloads
        self.ctx = ctx
        self.addresses = addresses
        self.store = store
        self.pid = pid
        self.same_host = same_host  # whether the orchestrator shares this machine (its ReplicaReady says so)
        self.stop = threading.Event()
        self.inbox: queue.Queue[ReplicaInput] = queue.Queue()
        self.outbox: queue.Queue[ReplicaMessage | object] = queue.Queue()
        self.passes = 0  # engine loop passes begun; the pulse thread reads it (an int: one atomic read)

    def run(self) -> None:
        """Runs until ``Shutdown`` arrives or the worker cannot be built; returns after the threads stop."""
        threads = [threading.Thread(target=self._input_thread, name="replica-in", daemon=True),
                   threading.Thread(target=self._output_thread, name="replica-out", daemon=True),
                   threading.Thread(target=self._pulse_thread, name="replica-pulse", daemon=True)]
        for t in threads:
            t.start()
        try:
            worker = self.factory()
            step_seconds = worker.step_profile()
        except Exception as exc:  # noqa: BLE001 - any load failure is reported, then the replica exits
            logger.exception("stage worker failed to start")
            self.outbox.put(ReplicaFailed(f"{type(exc).__name__}: {exc}"))
        else:
            self.outbox.put(ReplicaReady(worker.load(), self.pid, self.same_host, step_seconds))
            try:
                self._engine_loop(worker)
            finally:
                worker.close()
        finally:
            self.stop.set()
            self.outbox.put(_STOP)
            for t in threads:
                t.join(timeout=5)

    # Engine side -------------------------------------------------------------------------------
    def _engine_loop(self, worker: StageWorker) -> None:
        last_load: ReplicaLoad | None = None
        busy = False
        while not self.stop.is_set():
            self.passes += 1
            outputs: list[StageOutput] = []
            for message in self._take_inputs(block=not busy):
                if isinstance(message, Shutdown):
                    return
                outputs += self._apply(worker, message)
            busy = False
            if worker.has_work():
                busy = self._step(worker, outputs)
            load = worker.load()
            if outputs or load != last_load:
                self.outbox.put(StepBatch(outputs, load))
                last_load = load

    def _take_inputs(self, block: bool) -> list[ReplicaInput]:
        messages = []
        try:
            messages.append(self.inbox.get(timeout=IDLE_WAIT_S) if block else self.inbox.get_nowait())
            while True:
                messages.append(self.inbox.get_nowait())
        except queue.Empty:
            return messages

    @staticmethod
    def _apply(worker: StageWorker, message: ReplicaInput) -> list[StageOutput]:
        if isinstance(message, AbortRequests):
            worker.abort(message.request_ids)
            return []
        try:
            return worker.handle(message)
        except Exception as exc:  # noqa: BLE001 - a bad input fails its request, not the replica
            logger.exception("stage input failed")
            rid = getattr(message, "request_id", "")
            worker.abort([rid])
            return [RequestFailed(rid, f"{type(exc).__name__}: {exc}")]

    @staticmethod
    def _step(worker: StageWorker, outputs: list[StageOutput]) -> bool:
        try:
            result = worker.step()
        except Exception as exc:  # noqa: BLE001 - the requests in the failed batch are failed, the loop goes on
            logger.error("stage step failed:\n%s", traceback.format_exc())
            held = worker.request_ids()
            worker.abort(held)
            outputs.extend(RequestFailed(rid, f"{type(exc).__name__}: {exc}") for rid in held)
            return False
        outputs.extend(result.outputs)
        return result.progressed

    # I/O threads --------------------------------------------------------------------------------
    def _input_thread(self) -> None:
        receiver = Receiver(self.ctx, self.addresses.inputs, self.payloads.replica_input(), self.store, bind=False)
        try:
            while not self.stop.is_set():
                message = receiver.recv(timeout_ms=int(IDLE_WAIT_S * 1000))
                if message is not None:
                    self.inbox.put(message)
                if isinstance(message, Shutdown):
                    return  # nothing after it matters; returning now spares the shutdown an idle wait
        finally:
            receiver.close()

    def _pulse_thread(self) -> None:
        # Its own thread, so a long step cannot delay it; the pass count it carries tells a long step
        # (the count moves between beats over time) from one that never ends (it stops).
        while not self.stop.wait(HEARTBEAT_S):
            self.outbox.put(Heartbeat(self.passes))

    def _output_thread(self) -> None:
        sender = Sender(self.ctx, self.addresses.outputs, self.payloads.replica_message(), self.store, bind=False)
        try:
            while True:
                message = self.outbox.get()
                if message is _STOP:
                    return
                sender.send(message)
        finally:
            sender.close(linger_ms=FLUSH_MS)
