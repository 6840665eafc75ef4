"""CPU time read from ``/proc`` (Linux), for ``bench serve``'s roofline.

- :func:`cpu_seconds`: a process's own time (user + system, not its children's): what ``--url --server-pid``
  charges the server process (HTTP and orchestrator, without its stage replicas) per audio second.
- :func:`stage_cpu_seconds`: the time of each stage's replica processes below a root (the server, or the bench's
  own process for its in-process pipeline), by the stage each replica's command line names. With the server's,
  it says what a second of audio costs the whole machine, so a level's throughput can be read against what the
  cores allow (cores / CPU seconds per audio second).
"""

from __future__ import annotations

import os
from pathlib import Path

STAGE_FLAG = "--stage"  # how a replica process names its stage (omnistage.pipeline.replica_process)


def cpu_seconds(pid: int) -> float:
    """User + system seconds the process ``pid`` has used so far (Linux)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    # After the command's closing parenthesis: state is field 3, utime and stime are fields 14 and 15.
    utime, stime = int(fields[11]), int(fields[12])
    return (utime + stime) / os.sysconf("SC_CLK_TCK")


def _children(pid: int) -> list[int]:
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        found += [int(c) for c in (task / "children").read_text().split()]
    return found


def _stage_of(pid: int) -> str | None:
    args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    for flag, value in zip(args, args[1:]):
        if flag.decode(errors="replace") == STAGE_FLAG:
            return value.decode(errors="replace")
    return None


def stage_cpu_seconds(root: int) -> dict[str, float]:
    """CPU seconds so far of every replica process below ``root``, summed per stage (a replica's own children,
    e.g. a compile worker, count for its stage); processes that name no stage are left out. A process that ends
    while it is read is skipped: what it used is lost to the sum, as it is to the kernel's accounting."""
    totals: dict[str, float] = {}
    pending = [(pid, None) for pid in _children(root)]
    while pending:
        pid, stage = pending.pop()
        try:
            stage = stage or _stage_of(pid)
            if stage is not None:
                totals[stage] = totals.get(stage, 0.0) + cpu_seconds(pid)
            pending += [(child, stage) for child in _children(pid)]
        except (FileNotFoundError, ProcessLookupError):
            continue
    return totals
