"""Replica processes log at the server's ``--log-level``: their start-up lines (each stage's KV budget) show at info
and not at warning."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

pytestmark = pytest.mark.e2e

KV_LINE = "INFO omnistage.runner.ar_runner: KV cache"


def _log_until_ready(level: str) -> list[str]:
    proc = subprocess.Popen([sys.executable, "-m", "omnistage.entrypoints.cli", "serve", "tiny", "--port", "0",
                             "--log-level", level], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    log: list[str] = []
    deadline = time.monotonic() + 300
    try:
        for line in proc.stderr:
            log.append(line)
            if "omnistage is ready" in line or time.monotonic() > deadline:
                break
    finally:
        proc.kill()
        proc.wait(30)
    assert any("omnistage is ready" in line for line in log), "".join(log[-30:])
    return log


@pytest.mark.parametrize(("level", "shown"), [("info", True), ("warning", False)])
def test_replicas_log_at_the_servers_level(level: str, shown: bool) -> None:
    log = _log_until_ready(level)
    assert any(line.startswith(KV_LINE) for line in log) == shown, "".join(log)
