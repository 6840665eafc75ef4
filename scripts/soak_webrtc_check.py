"""Issue 51's WebRTC probes alone, under a /health canary every 50 ms: each probe's verdict, the canary's worst
latency while it ran, and the server's RSS after each round (flat: the calls and their sockets are given back).

The canary polls from a process of its own: in the probes' process it would wait behind their own event loop
(400 offers sent at once kept a client loop busy for seconds) and charge that to the server.

    .venv/bin/python scripts/soak_webrtc_check.py --rounds 3 --json webrtc-check.json   # starts `serve tiny`
    .venv/bin/python scripts/soak_webrtc_check.py --url http://127.0.0.1:8000 --server-pid PID

Exit status 0 only when every probe passed and the canary never took longer than --max-canary-ms.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import sys
import time
from multiprocessing.connection import Connection
from multiprocessing.synchronize import Event
from pathlib import Path

import httpx
from soak_server import API_KEY, rss_by_process, start_server, stop
from soak_webrtc_probes import WebRtcProbes

CANARY_S = 0.05


def _canary(url: str, stop: Event, out: Connection) -> None:
    """``(time.time() sent, latency)`` of each /health, polled until ``stop``, sent back through ``out``."""
    polls: list[tuple[float, float]] = []
    with httpx.Client(base_url=url, timeout=60) as client:
        while not stop.is_set():
            started = time.time()
            try:
                client.get("/health")
            except httpx.HTTPError:
                pass
            polls.append((started, time.time() - started))
            time.sleep(CANARY_S)
    out.send(polls)


async def _run(url: str, pid: int | None, rounds: int) -> dict[str, object]:
    results: list[tuple[str, bool, str]] = []
    probes = WebRtcProbes(url, API_KEY, lambda kind, _started, ok, detail: results.append((kind, ok, detail)))
    windows: list[tuple[str, float, float]] = []
    rss: list[int] = []
    stop, (theirs, ours) = multiprocessing.Event(), multiprocessing.Pipe()
    watcher = multiprocessing.Process(target=_canary, args=(url, stop, ours), daemon=True)
    watcher.start()
    async with httpx.AsyncClient(base_url=url, timeout=300) as client:
        for _ in range(rounds):
            for name, probe in probes.all():
                started = time.time()
                await probe(client)
                windows.append((name, started, time.time()))
            if pid is not None:
                rss.append(rss_by_process(pid)["api"] // 1024)
    stop.set()
    canary: list[tuple[float, float]] = theirs.recv()
    watcher.join()
    worst: dict[str, float] = {}
    for name, start, end in windows:  # each probe's worst over the rounds
        during = max((lat for t, lat in canary if start <= t <= end), default=0.0)
        worst[name] = max(worst.get(name, 0.0), round(during * 1000, 1))
    return {"probes": [{"probe": k, "ok": ok, "detail": d} for k, ok, d in results], "canary_polls": len(canary),
            "canary_max_ms_during_probe": worst, "api_rss_mib_after_each_round": rss}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--url", default=None, help="a running server, started with --api-key soak-key")
    parser.add_argument("--server-pid", type=int, default=None, help="its pid, for its RSS")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--max-canary-ms", type=float, default=250.0)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    proc = None
    if args.url is None:
        proc, url = start_server("tiny")
        pid: int | None = proc.pid
    else:
        url, pid = args.url.rstrip("/"), args.server_pid
    try:
        figures = asyncio.run(_run(url, pid, args.rounds))
    finally:
        if proc is not None:
            stop(proc)
    text = json.dumps(figures, indent=2)
    print(text)
    if args.json is not None:
        args.json.write_text(text)
    slow = [n for n, ms in figures["canary_max_ms_during_probe"].items() if ms > args.max_canary_ms]  # type: ignore[union-attr]
    return 0 if all(p["ok"] for p in figures["probes"]) and not slow else 1  # type: ignore[union-attr,index]


if __name__ == "__main__":
    sys.exit(main())
