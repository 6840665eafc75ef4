"""Starting and stopping stage replicas, as processes (the default) or as threads (tests, debugging).

(Replicas on a Ray cluster are ``omnistage.pipeline.ray_replica.RayReplica``, the same handle interface.)

Processes are fresh interpreters running ``omnistage.pipeline.replica_process``
(forking a process that already runs torch threads is unsafe, and
``multiprocessing``'s spawn would re-import the caller's main module); the launch reaches it pickled on its
stdin. A replica process must never outlive its parent: it asks the kernel for SIGTERM when the parent dies
(Linux) and also polls its parent id, then removes the parent's sockets and shared memory and exits
(``replica_process.py``); the parent stops every replica on shutdown and at exit.
"""

from __future__ import annotations

import logging
import os
import pickle
import subprocess
import sys
import threading
from abc import ABC, abstractmethod
from dataclasses import dataclass

import zmq

from omnistage.ipc.messages import PayloadTypes
from omnistage.pipeline.connectors import make_connector
from omnistage.pipeline.replica import ReplicaAddresses, ReplicaLoop
from omnistage.workers.base import WorkerFactory


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
    timed: bool = False  # sends each request's times here (``StageTimes``), for tracing
    stream_interval_s: float = 0.0  # a request's tokens leave at most this often, merged (``TokenCoalescer``)
    log_level: int = logging.INFO  # the server's (``--log-level``): a replica's own lines at the same threshold


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
    def waiting_for(self) -> str:
        """What a started replica waits for before it can run (a Ray node that fits it); empty when nothing."""
        return ""

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
        self.loop = ReplicaLoop(launch.factory, ctx, launch.addresses, store, os.getpid(), launch.payloads,
                                timed=launch.timed, stream_interval_s=launch.stream_interval_s)
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
        self.process = _start_replica_process(self.launch, os.getpid())

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


def _replica_argv(stage: str, index: int, pipeline_id: str) -> list[str]:
    """The replica's command line: the module, then its place in words (for ``ps``; the process ignores them)."""
    return [sys.executable, "-m", "omnistage.pipeline.replica_process", "--pipeline", pipeline_id,
            "--stage", stage, "--replica", str(index)]


def _start_replica_process(launch: ReplicaLaunch, parent_pid: int) -> subprocess.Popen[bytes]:
    child = subprocess.Popen(_replica_argv(launch.stage, launch.index, launch.pipeline_id), stdin=subprocess.PIPE,
                             close_fds=True)
    assert child.stdin is not None
    try:
        child.stdin.write(pickle.dumps((list(sys.path), pickle.dumps((launch, parent_pid)))))
    finally:
        child.stdin.close()
    return child
