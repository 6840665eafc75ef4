"""What each soak probe costs the server when it runs alone: its wall seconds, the API process's CPU seconds
(its threads and pools, not the stage replicas), and the slowest /health answer meanwhile (every 50 ms). The
probes past a second of API CPU or a ~0.2 s wait for /health are the soak's heavy ones (``HEAVY_PROBES`` in
``soak_sessions.py``): a reply that meets one waits on it.

    .venv/bin/python scripts/soak_probe_costs.py            # starts `omnistage serve tiny`
    .venv/bin/python scripts/soak_probe_costs.py --url http://127.0.0.1:8000 --server-pid PID
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import time

import httpx
from soak_probes import Probes
from soak_server import API_KEY, start_server

from omnistage.tools.bench.process_cpu import cpu_seconds


async def _canary(url: str, done: asyncio.Event, waits: list[float]) -> None:
    async with httpx.AsyncClient(base_url=url, timeout=60) as client:
        while not done.is_set():
            started = time.monotonic()
            await client.get("/health")
            waits.append(time.monotonic() - started)
            await asyncio.sleep(0.05)


async def measure(url: str, model: str, pid: int) -> list[tuple[str, float, float, float]]:
    """(probe, wall s, API CPU s, worst /health wait s) for each probe, in the soak's order."""
    probes = Probes(url, model, API_KEY, lambda *_: None, server_pid=pid)
    rows = []
    async with httpx.AsyncClient(base_url=url, timeout=300, headers=probes.headers) as client:
        for name, probe in probes.all():
            done, waits = asyncio.Event(), []
            canary = asyncio.create_task(_canary(url, done, waits))
            cpu, started = cpu_seconds(pid), time.monotonic()
            await probes.run(name, probe, client)
            rows.append((name, time.monotonic() - started, cpu_seconds(pid) - cpu, max(waits, default=0.0)))
            done.set()
            await canary
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--url", default=None, help="a running server (default: start one)")
    parser.add_argument("--server-pid", type=int, default=None, help="its pid (with --url)")
    parser.add_argument("--model", default="tiny")
    args = parser.parse_args()
    if args.url is not None and args.server_pid is None:
        parser.error("--url needs --server-pid (the API process whose CPU is counted)")
    proc = None
    url, pid = args.url, args.server_pid
    if url is None:
        proc, url = start_server(args.model)
        pid = proc.pid
    try:
        print(f"{'probe':28s} {'wall s':>7s} {'API CPU s':>9s} {'worst /health ms':>16s}")
        for name, wall, cpu, worst in asyncio.run(measure(url, args.model, pid)):
            print(f"{name:28s} {wall:7.2f} {cpu:9.2f} {worst * 1000:16.1f}", flush=True)
    finally:
        if proc is not None:
            os.killpg(proc.pid, signal.SIGTERM)


if __name__ == "__main__":
    main()
