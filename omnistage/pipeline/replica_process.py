"""The entry point of a replica process: ``python -m omnistage.pipeline.replica_process``.

A replica is started as a fresh interpreter running this module, never by
``multiprocessing``'s spawn, which re-imports the caller's ``__main__``: a
script without an ``if __name__ == "__main__"`` guard, ``python -`` (stdin) or a
notebook would then run (or fail to find) the caller's code again in every
replica. The parent writes the replica's launch to its stdin, pickled with the
parent's ``sys.path`` (so factories defined in the caller's importable modules
resolve); the child reads it once and runs the replica loop. Its command line also names the pipeline, stage
and replica (``--stage talker --replica 0``), read by nobody here: so that ``ps``, ``top`` and an operator's
scripts can tell the replicas apart.
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the launcher imports this module; the child imports the launcher only once it runs
    from omnistage.pipeline.launcher import ReplicaLaunch


def replica_argv(stage: str, index: int, pipeline_id: str) -> list[str]:
    """The replica's command line: the module, then its place in words (ignored by :func:`main`)."""
    return [sys.executable, "-m", "omnistage.pipeline.replica_process", "--pipeline", pipeline_id,
            "--stage", stage, "--replica", str(index)]


def start_replica_process(launch: ReplicaLaunch, parent_pid: int) -> subprocess.Popen[bytes]:
    child = subprocess.Popen(replica_argv(launch.stage, launch.index, launch.pipeline_id), stdin=subprocess.PIPE,
                             close_fds=True)
    assert child.stdin is not None
    try:
        child.stdin.write(pickle.dumps((list(sys.path), pickle.dumps((launch, parent_pid)))))
    finally:
        child.stdin.close()
    return child


def main() -> None:
    path, payload = pickle.load(sys.stdin.buffer)
    sys.path[:] = [p for p in path if p] + [p for p in sys.path if p not in path]
    launch, parent_pid = pickle.loads(payload)
    os.dup2(os.open(os.devnull, os.O_RDONLY), 0)  # stdin was only the launch

    from omnistage.pipeline.launcher import replica_main

    replica_main(launch, parent_pid)


if __name__ == "__main__":
    main()
