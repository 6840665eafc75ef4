"""What every ``bench serve`` backend shares: its prompts, a server's SSE stream read into a record, and the
concurrency levels run (each with at most ``c`` requests in flight) into figures.

The chat backend (``serve.py``) and the speech backend (``speech.py``) each bring their drivers (in-process and
over HTTP); a driver has ``stream(prompt, seed) -> StreamRecord`` and ``close()``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

from omnistage.tools.bench.metrics import StreamRecord, summarize
from omnistage.tools.bench.process_cpu import cpu_seconds, stage_cpu_seconds


@dataclass(frozen=True)
class BenchPrompt:
    token_ids: list[int]
    text: str


async def sse_record(client, url: str, body: dict, consume: Callable[[StreamRecord, dict, float], None],  # noqa: ANN001
                     ) -> StreamRecord:
    """POSTs ``body`` and feeds each SSE ``data:`` event to ``consume`` until ``[DONE]`` or the stream ends; a failed
    request is a figure (its error), not a crash."""
    record = StreamRecord(time.perf_counter())
    try:
        async with client.stream("POST", url, json=body) as resp:
            if resp.status_code != 200:
                record.error = f"HTTP {resp.status_code}: {(await resp.aread())[:200]!r}"
                return record
            async for line in resp.aiter_lines():
                if not line.startswith("data: "):
                    continue
                now = time.perf_counter()
                if line[6:] == "[DONE]":
                    record.end = now
                    break
                consume(record, json.loads(line[6:]), now)
    except Exception as exc:  # noqa: BLE001 - a failed request is a figure, not a crash
        record.error = f"{type(exc).__name__}: {exc}"
    return record


async def run_level(driver, prompts: list[BenchPrompt], concurrency: int, seed: int,  # noqa: ANN001
                    on_done: Callable[[], None] = lambda: None) -> tuple[list[StreamRecord], float]:
    """All ``prompts`` with at most ``concurrency`` in flight; returns the records and the wall time."""
    gate = asyncio.Semaphore(concurrency)

    async def one(i: int, prompt: BenchPrompt) -> StreamRecord:
        async with gate:
            record = await driver.stream(prompt, seed + i)
        on_done()
        return record

    start = time.perf_counter()
    records = await asyncio.gather(*(one(i, p) for i, p in enumerate(prompts)))
    return list(records), time.perf_counter() - start


def progress_bar(total: int, desc: str):  # noqa: ANN202
    try:
        from tqdm import tqdm

        return tqdm(total=total, desc=desc, file=sys.stderr, leave=False)
    except ImportError:
        return None


async def bench_levels(driver, prompts: list[BenchPrompt], levels: list[int], seed: int,  # noqa: ANN001
                       warmup: int = 1, progress: bool = True,
                       server_cpu: Callable[[], float] | None = None,
                       stage_cpu: Callable[[], dict[str, float]] | None = None) -> dict[int, dict[str, float]]:
    """``server_cpu``: the server process's CPU seconds so far; ``stage_cpu``: each stage's replicas'. Each level
    then says what a second of its audio cost them, and how many cores they kept busy on average."""
    if warmup:
        await run_level(driver, prompts[:warmup], warmup, seed)
    results = {}
    for c in levels:
        bar = progress_bar(len(prompts), f"concurrency {c}") if progress else None
        cpu_before = server_cpu() if server_cpu else 0.0
        stages_before = stage_cpu() if stage_cpu else {}
        records, wall = await run_level(driver, prompts, c, seed, (lambda: bar.update(1)) if bar else (lambda: None))
        if bar is not None:
            bar.close()
        results[c] = summarize(records, wall)
        if results[c]["total_audio_s"] > 0:
            _charge_cpu(results[c], wall, server_cpu() - cpu_before if server_cpu else None,
                        _spent(stages_before, stage_cpu()) if stage_cpu else None)
    return results


def _spent(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """CPU seconds per stage between two readings (a replica started during the level counts from zero)."""
    return {stage: max(0.0, spent - before.get(stage, 0.0)) for stage, spent in sorted(after.items())}


def _charge_cpu(figures: dict, wall: float, server: float | None, stages: dict[str, float] | None) -> None:
    audio = figures["total_audio_s"]
    if server is not None:
        figures["server_cpu_s"], figures["server_cpu_s_per_audio_s"] = server, server / audio
    if stages is not None:
        figures["stage_cpu_s_per_audio_s"] = {stage: spent / audio for stage, spent in stages.items()}
        total = (server or 0.0) + sum(stages.values())
        figures["cpu_s_per_audio_s"], figures["cores_busy"] = total / audio, total / wall


async def drive(args: argparse.Namespace, prompts: list[BenchPrompt],
                driver) -> dict[int, dict[str, float]]:  # noqa: ANN001
    """Every level of ``bench serve``'s flags (after its warm-up), then the driver closed, with the CPU time each
    level cost: with ``--server-pid``, the server process's and its stages'; in process, this process's (the
    orchestrator and the bench's own client) and its stages'."""
    pid = getattr(args, "server_pid", None) or (None if getattr(args, "url", None) else os.getpid())
    server_cpu = (lambda: cpu_seconds(pid)) if pid else None
    stage_cpu = (lambda: stage_cpu_seconds(pid)) if pid else None
    try:
        return await bench_levels(driver, prompts, args.concurrency, args.seed, args.warmup, not args.no_progress,
                                  server_cpu, stage_cpu)
    finally:
        await driver.close()
