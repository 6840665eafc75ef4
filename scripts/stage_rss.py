"""Each stage process's RSS against the requests served: the tiny pipeline (the `serve tiny` preset, stage
processes) driven in-process through ``AsyncOmni`` with chats asking for audio, a quarter of them left after a
few deltas and a quarter cancelled mid-wait, the rest read to the end. A stage whose RSS still rises after the
first thousand or so requests keeps something per request or per new shape; the soak's RSS bar in minutes.

    .venv/bin/python scripts/stage_rss.py --requests 3000 --json rss.json
    ONEDNN_PRIMITIVE_CACHE_CAPACITY=0 .venv/bin/python scripts/stage_rss.py   # oneDNN's cache off, to compare
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import time
from contextlib import aclosing

from omnistage.core import Modality, OmniRequest
from omnistage.pipeline.async_omni import AsyncOmni
from omnistage.pipeline.runtime import PipelineOptions
from omnistage.sampling_params import SamplingParams

WORDS = ("alpha", "beta", "gamma", "delta", "omega")


def stage_rss_mib() -> dict[str, float]:
    """``"stage PID"`` -> VmRSS of each replica process this one started."""
    out = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            status = open(f"/proc/{pid}/status").read()
            argv = open(f"/proc/{pid}/cmdline").read().split("\0")
        except OSError:
            continue
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        if int(fields["PPid"]) == os.getpid() and "--stage" in argv:
            out[f"{argv[argv.index('--stage') + 1]} {pid}"] = int(fields["VmRSS"].split()[0]) / 1024
    return out


def _request(engine: AsyncOmni, i: int, rng: random.Random) -> OmniRequest:
    words = " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 30)))
    processor = engine.front_end.processor
    prompt = processor.process(processor.apply_chat_template([{"role": "user", "content": f"{i} {words}"}]))
    return OmniRequest(f"rss-{i}", prompt, frozenset({Modality.TEXT, Modality.AUDIO}),
                       SamplingParams(max_tokens=rng.randint(4, 40), seed=i), voice="Ethan")


async def _read(engine: AsyncOmni, request: OmniRequest, leave_after: int) -> None:
    async with aclosing(engine.generate(request)) as stream:
        count = 0
        async for out in stream:
            count += 1
            if out.finished or count == leave_after:
                return


async def drive(engine: AsyncOmni, requests: int, concurrency: int, every: int) -> list[list]:
    rng, limit, timeline = random.Random(0), asyncio.Semaphore(concurrency), []
    started, done = time.monotonic(), 0

    async def one(i: int) -> None:
        nonlocal done
        async with limit:
            leave_after = rng.randint(2, 20) if i % 4 == 1 else 0  # 0: read to the end
            task = asyncio.ensure_future(_read(engine, _request(engine, i, rng), leave_after))
            if i % 4 == 2:
                await asyncio.sleep(rng.uniform(0, 0.5))
                task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                if not task.cancelled():
                    raise
            done += 1
            if done % every == 0:
                rss = {name: round(mib, 1) for name, mib in stage_rss_mib().items()}
                timeline.append([done, round(time.monotonic() - started), rss])
                print(timeline[-1], flush=True)

    await asyncio.gather(*(one(i) for i in range(requests)))
    return timeline


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=3000)
    parser.add_argument("--concurrency", type=int, default=3)
    parser.add_argument("--every", type=int, default=100, help="requests between RSS readings")
    parser.add_argument("--json", default="", help="where the timeline [requests, seconds, {stage: MiB}] goes")
    args = parser.parse_args()
    engine = AsyncOmni("tiny", None, PipelineOptions(talker_min_new_tokens=4), "tiny")
    try:
        timeline = asyncio.run(drive(engine, args.requests, args.concurrency, args.every))
    finally:
        asyncio.run(engine.shutdown())
    if args.json:
        with open(args.json, "w") as f:
            json.dump(timeline, f)


if __name__ == "__main__":
    main()
