"""The orchestrator: one thread that owns every replica socket and every request's state.

Callers (the asyncio server, the sync ``Omni``) hand it commands through a
queue and a wake-up socket; it never blocks on them and they never touch its
state. Each pass waits until some socket is readable, runs the queued
commands, then drains *every* message already waiting from *every* replica
(not one per replica, and never waiting on an empty one), so an audio chunk
that is ready reaches its caller within one pass however many internal
messages (tokens for the talker, frames for code2wav) queued with it.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from dataclasses import dataclass, field, replace

import zmq

from omnistage.core import FinishReason, Modality, OmniRequest, PromptDelta
from omnistage.ipc.messages import (
    Heartbeat,
    InputBatch,
    PayloadTypes,
    ReplicaFailed,
    ReplicaInput,
    ReplicaLoad,
    ReplicaMessage,
    ReplicaReady,
    RequestFailed,
    StageOutput,
    StageTimes,
    StepBatch,
)
from omnistage.ipc.queues import Receiver, Sender, next_address
from omnistage.ipc.serialization import TensorStore
from omnistage.pipeline.detokenizer import Tokenizer
from omnistage.pipeline.flow import FlowSettings, RequestFlows
from omnistage.pipeline.launcher import ReplicaHandle
from omnistage.pipeline.liveness import Liveness, StallBounds
from omnistage.pipeline.replica import ReplicaAddresses
from omnistage.pipeline.reports import (
    EngineStats,
    HealthReport,
    ReplicaHealth,
    ReplicaStats,
    StageHealth,
)
from omnistage.pipeline.request_state import OutputSink, RequestTrace, TraceSink
from omnistage.pipeline.router import StageRouter

logger = logging.getLogger(__name__)
LIVENESS_EVERY_S = 0.5



def kv_cache_bytes(load: ReplicaLoad) -> int:
    """Bytes of a replica's KV pool: its usable blocks plus the null block."""
    return (load.kv_blocks_total + 1) * load.kv_block_bytes if load.kv_block_bytes else 0

class PipelineStartError(RuntimeError):
    """A replica failed to load or died before it was ready."""


@dataclass
class ReplicaLink:
    """The orchestrator's end of one replica: its sockets, handle and last reported state."""

    stage: str
    index: int
    handle: ReplicaHandle
    sender: Sender
    receiver: Receiver
    ready: bool = False
    peer_address: str = ""  # where other replicas send it inputs (its ReplicaReady says)
    failed: str = ""  # why it is unhealthy; empty while healthy
    load: ReplicaLoad = field(default_factory=ReplicaLoad)
    restarts: int = 0  # times this replica was started again after dying
    restart_at: float | None = None  # when the next restart is due (set while it is down)
    restarting: bool = False  # a new process/thread is loading; healthy again at its ReplicaReady
    liveness: Liveness = field(default_factory=Liveness)
    # The pipeline's tensor connector; the sender drops it for a replica on another machine (``use_store``).
    store: TensorStore | None = None
    payloads: PayloadTypes = field(default_factory=lambda: PayloadTypes(()))  # what its sockets decode

    def respawn(self, ctx: zmq.Context) -> None:
        """A new, unstarted handle on fresh sockets at new addresses (``next_address``)."""
        old = self.handle.launch.addresses
        self.sender.close()
        self.receiver.close()
        self.sender = Sender(ctx, next_address(old.inputs, self.restarts), self.payloads.replica_input(), self.store,
                             bind=True)
        self.receiver = Receiver(ctx, next_address(old.outputs, self.restarts), self.payloads.replica_message(),
                                 self.store, bind=True)
        addresses = ReplicaAddresses(self.sender.address, self.receiver.address,
                                     next_address(old.peer, self.restarts) if old.peer else "")
        self.handle = self.handle.respawn(replace(self.handle.launch, addresses=addresses))

    def use_store(self, same_host: bool) -> None:
        """Tensors to a replica on another machine go in the message frames: it cannot read this one's
        shared memory. (Nothing carrying a tensor is sent before its ``ReplicaReady`` says where it is.)"""
        self.sender.codec.store = self.store if same_host else None

    @property
    def healthy(self) -> bool:
        return self.ready and not self.failed


@dataclass(frozen=True)
class _Submit:
    request: OmniRequest
    sink: OutputSink


@dataclass(frozen=True)
class _Abort:
    request_id: str


@dataclass(frozen=True)
class _Feed:
    request_id: str
    delta: PromptDelta


class Orchestrator:
    def __init__(self, settings: FlowSettings, links: list[ReplicaLink], tokenizer: Tokenizer | None,
                 ctx: zmq.Context, stall: StallBounds = StallBounds(), trace_sink: TraceSink | None = None) -> None:
        self.stall = stall
        self.links = {(link.stage, link.index): link for link in links}
        stages = dict.fromkeys(link.stage for link in links)
        self.routers = {s: StageRouter(s, sum(1 for link in links if link.stage == s)) for s in stages}
        self.flows = RequestFlows(settings, self.routers, self._send, tokenizer, self._peer_address, trace_sink)
        graph = settings.graph  # what each output needs is fixed: worked out once, not on every admission's report
        self._needs = tuple((m, graph.stages_for(frozenset({m}))) for m in Modality if graph.supports(m))
        self._commands: queue.SimpleQueue[_Submit | _Abort | _Feed] = queue.SimpleQueue()
        address = f"inproc://omnistage-waker-{id(self)}"
        self._wake_rx = ctx.socket(zmq.PULL)
        self._wake_rx.bind(address)
        self._wake_tx = ctx.socket(zmq.PUSH)
        self._wake_tx.connect(address)
        self._wake_lock = threading.Lock()
        self._wake_pending = False  # a wake-up was sent and its pass has not yet taken the commands
        self._poller = zmq.Poller()
        self._poller.register(self._wake_rx, zmq.POLLIN)
        for link in links:
            self._poller.register(link.receiver.socket, zmq.POLLIN)
        self._outbox: dict[tuple[str, int], list[ReplicaInput]] = {}  # this pass's messages, per replica
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._last_liveness = 0.0
        self._ctx = ctx
        self.restart_replicas = False  # set by ``start``: a replica that dies while serving is started again

    # Thread-safe API -----------------------------------------------------------------------------
    def submit(self, request: OmniRequest, sink: OutputSink) -> None:
        self._command(_Submit(request, sink))

    def abort(self, request_id: str) -> None:
        self._command(_Abort(request_id))

    def feed(self, request_id: str, delta: PromptDelta) -> None:
        self._command(_Feed(request_id, delta))

    def _command(self, command: _Submit | _Abort | _Feed) -> None:
        if self._stop.is_set():
            raise RuntimeError("the pipeline is shut down")
        self._commands.put(command)
        with self._wake_lock:  # callers come from many threads; a zmq socket takes one at a time
            if self._wake_pending:
                return  # the loop is due to wake and runs every command queued by then, this one included
            self._wake_pending = True
            try:
                self._wake_tx.send(b"", zmq.NOBLOCK)
            except zmq.Again:
                pass  # the wake-up pipe is full: the loop is already due to wake and run every command

    def stats(self) -> EngineStats:
        return EngineStats(tuple(
            ReplicaStats(link.stage, link.index, link.load.kv_blocks_used, link.load.kv_blocks_total,
                         link.load.waiting, link.load.running, kv_cache_bytes(link.load),
                         link.load.graphs_captured, link.load.graph_capture_failures, link.sender.bytes,
                         link.receiver.bytes)
            for link in self.links.values()))

    def health(self) -> HealthReport:
        stages: dict[str, list[ReplicaHealth]] = {}
        for link in self.links.values():
            detail = link.failed or ("" if link.ready else "starting")
            if link.restarting and (waiting := link.handle.waiting_for):
                detail = f"{detail}; waiting for {waiting}"
            if link.restarts and not detail:
                detail = f"restarted {link.restarts} time(s)"
            stages.setdefault(link.stage, []).append(ReplicaHealth(link.index, link.healthy, detail,
                                                                   link.load.kv_blocks_total,
                                                                   kv_cache_bytes(link.load)))
        return HealthReport(tuple(StageHealth(stage, tuple(reps)) for stage, reps in stages.items()), self._needs)

    def trace(self, request_id: str) -> RequestTrace | None:
        """Milestone times of a finished request (the most recent few hundred are kept)."""
        return self.flows.traces.get(request_id)

    # Loop ---------------------------------------------------------------------------------------
    def start(self) -> None:
        self.restart_replicas = True
        self._thread = threading.Thread(target=self._run, name="omnistage-orchestrator", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        with self._wake_lock:
            try:
                self._wake_tx.send(b"", zmq.NOBLOCK)
            except zmq.Again:
                pass
        if self._thread is not None:
            self._thread.join(timeout=10)
        # Nobody will serve what is still in flight or queued: end it, so no caller waits for ever.
        self.flows.fail_all("the pipeline shut down")
        self._flush()
        while True:
            try:
                command = self._commands.get_nowait()
            except queue.Empty:
                break
            if isinstance(command, _Submit):
                self.flows.reject(command.request, command.sink, "the pipeline shut down")

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.poll_once(timeout_ms=int(LIVENESS_EVERY_S * 1000))
            except Exception:  # noqa: BLE001 - the loop must survive a bug in one message's handling
                logger.exception("orchestrator pass failed")

    def poll_once(self, timeout_ms: int = 0) -> int:
        """One pass: wait up to ``timeout_ms`` for any socket, then handle everything ready. Returns messages."""
        events = dict(self._poller.poll(timeout_ms))
        if self._wake_rx in events:
            while self._wake_rx.poll(0):
                self._wake_rx.recv()
        with self._wake_lock:
            self._wake_pending = False  # commands queued from here on wake the next pass
        handled = self._run_commands()
        for link in self.links.values():
            if link.receiver.socket not in events:
                continue  # nothing was waiting there when the pass began (what came since, the next pass takes)
            for message in link.receiver.drain():
                self._on_message(link, message)
                handled += 1
        self.flows.tick()
        self.flows.flush_orders()
        if time.monotonic() - self._last_liveness > LIVENESS_EVERY_S:
            self._check_liveness()
        self._flush()
        return handled

    def _run_commands(self) -> int:
        count = 0
        while True:
            try:
                command = self._commands.get_nowait()
            except queue.Empty:
                return count
            count += 1
            if isinstance(command, _Abort):
                self.flows.fail(command.request_id, None, FinishReason.ABORT)
            elif isinstance(command, _Feed):
                self.flows.feed(command.request_id, command.delta)
            else:
                self.flows.submit(command.request, command.sink)

    def _on_message(self, link: ReplicaLink, message: ReplicaMessage) -> None:
        if isinstance(message, Heartbeat):
            link.liveness.beat(time.monotonic(), message.passes)
        else:
            link.liveness.progressed(time.monotonic())
        if isinstance(message, StepBatch):
            link.load = message.load
            for output in message.outputs:
                self._on_output(link.stage, output)
            if message.notes is not None:
                self.flows.frames_noted(link.stage, message.notes)
        elif isinstance(message, ReplicaReady):
            link.ready, link.load, link.peer_address = True, message.load, message.peer_address
            if message.step_seconds:
                self.flows.stage_profiled(link.stage, message.step_seconds)
            link.liveness.became_healthy(time.monotonic())
            link.use_store(message.same_host)
            if link.restarting:
                logger.warning("stage %s replica %d is back (restart %d)", link.stage, link.index, link.restarts)
                link.restarting, link.failed = False, ""
                self.routers[link.stage].healthy[link.index] = True
        elif isinstance(message, ReplicaFailed):
            self._replica_down(link, message.error)

    def _on_output(self, stage: str, output: StageOutput | RequestFailed | StageTimes) -> None:
        try:
            if isinstance(output, StageTimes):  # a timed replica's view of its stage (only when tracing)
                state = self.flows.states.get(output.request_id)
                if state is not None:
                    state.trace.stage_times[stage] = output
            elif isinstance(output, RequestFailed):
                self.flows.fail(output.request_id, output.error)
            else:
                self.flows.on_output(stage, output)
        except Exception as exc:  # noqa: BLE001 - one request's failure must not stall the others
            logger.exception("handling an output of stage %s failed", stage)
            self.flows.fail(output.request_id, f"{type(exc).__name__}: {exc}")

    def _peer_address(self, stage: str, index: int) -> str:
        return self.links[(stage, index)].peer_address

    def _send(self, stage: str, index: int, message: ReplicaInput) -> None:
        """Queues a message for a replica; the pass's end sends each replica what it got, as one message."""
        self._outbox.setdefault((stage, index), []).append(message)

    def _flush(self) -> None:
        outbox, self._outbox = self._outbox, {}
        for (stage, index), items in outbox.items():
            self._transmit(stage, index, items[0] if len(items) == 1 else InputBatch(items))

    def _transmit(self, stage: str, index: int, message: ReplicaInput) -> None:
        link = self.links[(stage, index)]
        if not link.failed:  # a dead replica would never read it
            try:
                link.sender.send(message, block=False)
            except zmq.Again:
                # No peer: it died and zmq dropped its pipe before the liveness check noticed. Blocking
                # here would stall every request; the next pass's check fails this replica's requests.
                logger.warning("stage %s replica %d is not connected; dropped a %s", link.stage, link.index,
                               type(getattr(message, "payload", message)).__name__)
                self._last_liveness = 0.0

    # Replica health -------------------------------------------------------------------------------
    def _check_liveness(self) -> None:
        now = self._last_liveness = time.monotonic()
        for link in self.links.values():
            if link.restart_at is not None:
                if now >= link.restart_at:
                    self._restart(link)
            elif (not link.failed or link.restarting) and not link.handle.is_alive():
                for message in link.receiver.drain():  # its last words (e.g. why it failed) come first
                    self._on_message(link, message)
                self._replica_down(link, f"replica exited ({link.handle.exit_detail})")
            elif link.healthy and (why := link.liveness.hung(now, self.stall)):
                self._stalled(link, why)

    def _stalled(self, link: ReplicaLink, why: str) -> None:
        """Alive but hung (stopped, or a step that never ends): its requests fail now, and the process goes, to
        be restarted."""
        self._replica_down(link, f"{why}; killed, restarting")
        link.handle.kill()

    def _replica_down(self, link: ReplicaLink, error: str) -> None:
        if link.failed and not link.restarting:
            return
        logger.error("stage %s replica %d is down: %s", link.stage, link.index, error)
        link.failed, link.ready, link.restarting = error, False, False
        self.routers[link.stage].healthy[link.index] = False
        self.flows.fail_replica(link.stage, link.index, error)
        if self.restart_replicas:
            now = time.monotonic()
            link.restart_at = now + link.liveness.restart_delay(now)

    def _restart(self, link: ReplicaLink) -> None:
        """Starts the replica again; it serves once its ``ReplicaReady`` arrives (or fails and is retried)."""
        if link.handle.is_alive():
            link.handle.kill()  # e.g. it reported a failure but did not exit
        link.restart_at = None
        self._poller.unregister(link.receiver.socket)
        try:
            link.respawn(self._ctx)
        except NotImplementedError:
            logger.error("stage %s replica %d cannot be restarted; it stays down", link.stage, link.index)
            return
        finally:
            self._poller.register(link.receiver.socket, zmq.POLLIN)
        link.restarts += 1
        link.restart_at, link.restarting = None, True
        link.failed = f"restarting (attempt {link.restarts}) after: {link.failed.split(' after: ')[-1]}"
        logger.warning("restarting stage %s replica %d (attempt %d)", link.stage, link.index, link.restarts)
        link.handle.start()

    def wait_ready(self, timeout_s: float) -> None:
        """Polls (on the caller's thread, before ``start``) until every replica is ready."""
        deadline = time.monotonic() + timeout_s
        while not all(link.ready for link in self.links.values()):
            self.poll_once(timeout_ms=200)
            self._check_liveness()
            for link in self.links.values():
                if link.failed:
                    raise PipelineStartError(f"stage {link.stage!r} replica {link.index} failed to start: "
                                             f"{link.failed}")
            if time.monotonic() > deadline:
                slow = [f"{s}[{i}]" for (s, i), link in self.links.items() if not link.ready]
                raise PipelineStartError(f"replicas not ready after {timeout_s:.0f} s: {', '.join(slow)}")

    def close_sockets(self) -> None:
        with self._wake_lock:
            self._wake_tx.close(linger=0)
        self._wake_rx.close(linger=0)
        for link in self.links.values():
            link.sender.close()
            link.receiver.close()
