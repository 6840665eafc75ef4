"""Starting and stopping stage replicas, as processes (the default) or as threads (tests, debugging).

(Replicas on a Ray cluster are ``omnistage.pipeline.ray_replica.RayReplica``, the same handle interface.)

Processes are fresh interpreters running ``omnistage.pipeline.replica_process``
(forking a process that already runs torch threads is unsafe, and
``multiprocessing``'s spawn would re-import the caller's main module). A replica process must never outlive its parent:
it asks the kernel for SIGTERM when the parent dies (Linux) and also polls
its parent id, then removes the parent's sockets and shared memory and
exits; the parent stops every replica on shutdown and at exit.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import threading
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path

import zmq

from omnistage.ipc.messages import PayloadTypes
from omnistage.pipeline.connectors import make_connector
from omnistage.pipeline.replica import ReplicaAddresses, ReplicaLoop
from omnistage.workers.base import WorkerFactory

PARENT_POLL_S = 0.5
SIGTERM_SETTLE_S = 1.0
PR_SET_PDEATHSIG = 1


@dataclass(frozen=True)
class ReplicaLaunch:
    """Everything a replica needs, picklable for ``spawn``."""

    stage: str
    index: int
    factory: WorkerFactory
    addresses: ReplicaAddresses
    connector: str  # "inproc", "shm" or "frames" (Ray: used only on the orchestrator's node)
    pipeline_id: str
    num_threads: int = 1
    nice: int = 0  # added to the process's niceness (the stage's ``nice``)
    payloads: PayloadTypes = PayloadTypes(())  # what the replica's sockets decode (the pipeline's payload set)


class ReplicaHandle(ABC):
    def __init__(self, launch: ReplicaLaunch) -> None:
        self.launch = launch

    @abstractmethod
    def start(self) -> None: ...

    @abstractmethod
    def is_alive(self) -> bool: ...

    @abstractmethod
    def join(self, timeout: float) -> bool:
        """Waits for the replica to end after a Shutdown; True once it is gone."""

    @abstractmethod
    def kill(self) -> None:
        """Ends it now (after a Shutdown was ignored)."""

    def respawn(self, launch: ReplicaLaunch) -> ReplicaHandle:
        """A new, unstarted handle of the same kind for ``launch`` (this replica again, after it died)."""
        raise NotImplementedError(f"{type(self).__name__} cannot be restarted")

    @property
    def pid(self) -> int | None:
        return None

    @property
    def exitcode(self) -> int | None:
        return None

    @property
    def exit_detail(self) -> str:
        """How it ended, for the error its requests fail with."""
        return f"exit code {self.exitcode}"


class ThreadReplica(ReplicaHandle):
    """The replica's loop in a thread of this process, on the caller's zmq context (``inproc://``)."""

    def __init__(self, launch: ReplicaLaunch, ctx: zmq.Context) -> None:
        super().__init__(launch)
        store = make_connector(launch.connector, launch.pipeline_id)
        self.loop = ReplicaLoop(launch.factory, ctx, launch.addresses, store, os.getpid(), launch.payloads)
        self.thread = threading.Thread(target=self.loop.run, name=f"{launch.stage}-{launch.index}", daemon=True)
        self.ctx = ctx

    def respawn(self, launch: ReplicaLaunch) -> ReplicaHandle:
        return ThreadReplica(launch, self.ctx)

    def start(self) -> None:
        self.thread.start()

    def is_alive(self) -> bool:
        return self.thread.is_alive()

    def join(self, timeout: float) -> bool:
        if self.thread.ident is None:  # never started (a start-up failure tears down the rest)
            return True
        self.thread.join(timeout)
        return not self.thread.is_alive()

    def kill(self) -> None:
        self.loop.stop.set()  # a thread cannot be killed; the loop notices within its idle wait


class ProcessReplica(ReplicaHandle):
    """A replica in a fresh ``python -m omnistage.pipeline.replica_process`` interpreter (the caller's main module
    is never re-imported, so the Python API works from any script, stdin or a notebook)."""

    def __init__(self, launch: ReplicaLaunch) -> None:
        super().__init__(launch)
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        from omnistage.pipeline.replica_process import start_replica_process

        self.process = start_replica_process(self.launch, os.getpid())

    def respawn(self, launch: ReplicaLaunch) -> ReplicaHandle:
        return ProcessReplica(launch)

    def is_alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def join(self, timeout: float) -> bool:
        if self.process is None:  # never started (a start-up failure tears down the rest)
            return True
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            return False
        return True

    def kill(self) -> None:
        if self.is_alive():
            assert self.process is not None
            self.process.kill()
            try:
                self.process.wait(5)
            except subprocess.TimeoutExpired:
                pass

    @property
    def pid(self) -> int | None:
        return None if self.process is None else self.process.pid

    @property
    def exitcode(self) -> int | None:
        return None if self.process is None else self.process.poll()


def _orphan_exit(launch: ReplicaLaunch) -> None:
    """The parent is gone (or we were told to go): remove what it would have removed, then exit at once."""
    for address in (launch.addresses.inputs, launch.addresses.outputs, launch.addresses.peer):
        if address.startswith("ipc://"):
            path = Path(address.removeprefix("ipc://"))
            path.unlink(missing_ok=True)
            try:
                path.parent.rmdir()
            except OSError:
                pass  # another replica's sockets are still there; the last one out removes the folder
    store = make_connector(launch.connector, launch.pipeline_id)
    if store is not None:
        store.cleanup()
    os._exit(1)


def _on_sigterm(launch: ReplicaLaunch, parent_pid: int) -> None:
    # The parent-death signal can come while the parent's other threads are still exiting (getppid
    # has not changed yet): wait a moment before deciding that only this replica was told to go.
    deadline = time.monotonic() + SIGTERM_SETTLE_S
    while os.getppid() == parent_pid and time.monotonic() < deadline:
        time.sleep(0.02)
    if os.getppid() == parent_pid:
        # Only this replica was stopped: the parent restarts it, and the pipeline's sockets and shared
        # memory (other replicas' tensors in flight) are still in use.
        os._exit(1)
    _orphan_exit(launch)


def _die_with_parent(launch: ReplicaLaunch, parent_pid: int) -> None:
    # Ctrl-C reaches the whole process group; the parent decides when replicas stop.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, lambda *_: _on_sigterm(launch, parent_pid))
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
        except OSError:
            pass  # no libc by that name: the polling thread below still covers it

    def watch() -> None:
        # Also covers a main thread stuck in a long native call, where the SIGTERM handler cannot run yet.
        while os.getppid() == parent_pid:
            time.sleep(PARENT_POLL_S)
        _orphan_exit(launch)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def replica_main(launch: ReplicaLaunch, parent_pid: int) -> None:
    """The body of a replica process."""
    _die_with_parent(launch, parent_pid)
    import torch

    # Every replica of the machine shares its cores: one process must not claim them all.
    torch.set_num_threads(launch.num_threads)
    os.nice(launch.nice)  # this process's own priority (and its tensor-parallel ranks', which inherit it)
    ctx = zmq.Context()
    store = make_connector(launch.connector, launch.pipeline_id)
    try:
        ReplicaLoop(launch.factory, ctx, launch.addresses, store, os.getpid(), launch.payloads).run()
    finally:
        ctx.destroy(linger=0)
