"""The entry point of a replica process: ``python -m omnistage.pipeline.replica_process``.

A replica is started as a fresh interpreter running this module, never by
``multiprocessing``'s spawn, which re-imports the caller's ``__main__``: a
script without an ``if __name__ == "__main__"`` guard, ``python -`` (stdin) or a
notebook would then run (or fail to find) the caller's code again in every
replica. The parent writes the replica's launch to its stdin, pickled with the
parent's ``sys.path`` (so factories defined in the caller's importable modules
resolve); the child reads it once and runs the replica loop, dying with its parent. Its command line also names
the pipeline, stage and replica (``--stage talker --replica 0``), read by nobody here: so that ``ps``, ``top``
and an operator's scripts can tell the replicas apart. The parent's side (``ProcessReplica``, the command line)
is ``pipeline/launcher.py``'s.
"""

from __future__ import annotations

import ctypes
import logging
import os
import pickle
import signal
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

import zmq

from omnistage.pipeline.connectors import make_connector
from omnistage.pipeline.replica import ReplicaLoop

if TYPE_CHECKING:  # a type only here: the launch arrives pickled, and unpickling it imports the launcher
    from omnistage.pipeline.launcher import ReplicaLaunch

PARENT_POLL_S = 0.5
SIGTERM_SETTLE_S = 1.0
PR_SET_PDEATHSIG = 1


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
        ReplicaLoop(launch.factory, ctx, launch.addresses, store, os.getpid(), launch.payloads,
                    timed=launch.timed, stream_interval_s=launch.stream_interval_s).run()
    finally:
        ctx.destroy(linger=0)


def main() -> None:
    path, payload = pickle.load(sys.stdin.buffer)
    sys.path[:] = [p for p in path if p] + [p for p in sys.path if p not in path]
    launch, parent_pid = pickle.loads(payload)
    os.dup2(os.open(os.devnull, os.O_RDONLY), 0)  # stdin was only the launch
    # This interpreter's own log lines (a stage's KV budget, blocks and tokens at start-up) in the CLI's format and at
    # the server's level; without a handler only warnings would reach the server's stderr.
    logging.basicConfig(level=launch.log_level, format="%(levelname)s %(name)s: %(message)s")
    replica_main(launch, parent_pid)


if __name__ == "__main__":
    main()
