"""A process's own CPU time (user + system, not its children's), read from ``/proc``: what ``bench serve --url
--server-pid`` charges the server process (HTTP and orchestrator, without its stage replicas) per audio second."""

from __future__ import annotations

import os
from pathlib import Path


def cpu_seconds(pid: int) -> float:
    """User + system seconds the process ``pid`` has used so far (Linux)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    # After the command's closing parenthesis: state is field 3, utime and stime are fields 14 and 15.
    utime, stime = int(fields[11]), int(fields[12])
    return (utime + stime) / os.sysconf("SC_CLK_TCK")
