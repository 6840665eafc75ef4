"""The entry point of a replica process: ``python -m omnistage.pipeline.replica_process``.

A replica is started as a fresh interpreter running this module, never by
``multiprocessing``'s spawn, which re-imports the caller's ``__main__``: a
script without an ``if __name__ == "__main__"`` guard, ``python -`` (stdin) or a
notebook would then run (or fail to find) the caller's code again in every
replica. The parent writes the replica's launch to its stdin, pickled with the
parent's ``sys.path`` (so factories defined in the caller's importable modules
resolve); the child reads it once and runs the replica loop.
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys


def start_replica_process(launch: object, parent_pid: int) -> subprocess.Popen[bytes]:
    child = subprocess.Popen([sys.executable, "-m", "omnistage.pipeline.replica_process"], stdin=subprocess.PIPE,
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
