"""1,000 streams of the real tiny pipeline (stage processes, shared-memory tensors) left at random points:
afterwards no stage holds a KV block, a queued or running request, or a shared-memory segment, and the
pipeline still answers.

Driven in-process through ``AsyncOmni`` (the server's engine), the way the HTTP layer does on a client
disconnect: the consumer stops iterating (``aclose`` → abort) or its task is cancelled mid-wait.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter
from contextlib import aclosing
from pathlib import Path

import pytest

from omnistage.core import FinishReason, Modality, OmniRequest
from omnistage.pipeline.async_omni import AsyncOmni
from omnistage.pipeline.runtime import PipelineOptions
from omnistage.sampling_params import SamplingParams
from tests.pipeline.specs import small_dict, write_spec

pytestmark = pytest.mark.e2e
STREAMS = 1000
CONCURRENCY = 48


def _request(engine: AsyncOmni, i: int, max_tokens: int) -> OmniRequest:
    prompt = engine.front_end.processor.process(engine.front_end.processor.apply_chat_template(
        [{"role": "user", "content": f"cancel me {i}"}]))
    modalities = {Modality.TEXT, Modality.AUDIO} if i % 4 else {Modality.TEXT}
    return OmniRequest(f"cancel-{i}", prompt, frozenset(modalities), SamplingParams(max_tokens=max_tokens, seed=i),
                       voice="Ethan")


async def _leave_after(engine: AsyncOmni, request: OmniRequest, outputs: int, seen: Counter) -> None:
    """Reads ``outputs`` deltas, then walks away (the generator is closed, as a disconnect closes it)."""
    async with aclosing(engine.generate(request)) as stream:
        count = 0
        async for out in stream:
            count += 1
            seen["audio" if out.audio is not None else "text"] += 1
            if out.finished:
                seen["finished"] += 1
            if out.finished or count >= outputs:
                return


async def _drive(engine: AsyncOmni) -> Counter:
    rng = random.Random(0)
    seen: Counter = Counter()
    limit = asyncio.Semaphore(CONCURRENCY)

    async def one(i: int) -> None:
        async with limit:
            task = asyncio.ensure_future(_leave_after(engine, _request(engine, i, 64), rng.randint(1, 40), seen))
            if i % 2:  # the other half: cancelled after a random wait, wherever it is
                await asyncio.sleep(rng.uniform(0, 0.3))
                task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                if not task.cancelled():
                    raise

    await asyncio.gather(*(one(i) for i in range(STREAMS)))
    return seen


def _leftovers(engine: AsyncOmni) -> tuple[int, list[tuple[str, int, int, int, int]]]:
    stats = engine.stats()
    busy = [(r.stage, r.replica, r.kv_blocks_used, r.queue_depth, r.running) for r in stats.replicas
            if r.kv_blocks_used or r.queue_depth or r.running]
    return stats.shm_segments, busy


def test_a_thousand_cancelled_streams_leave_nothing_allocated(tiny_dir: Path, tmp_path: Path) -> None:
    config = write_spec(tmp_path, small_dict(talker_frames=16))
    engine = AsyncOmni(tiny_dir, config, PipelineOptions(talker_min_new_tokens=8, connector="shm"), "tiny")
    try:
        start = time.monotonic()
        seen = asyncio.run(_drive(engine))
        elapsed = time.monotonic() - start
        # Loads arrive with each replica's next message; give the last aborts a moment to land.
        deadline = time.monotonic() + 30
        while _leftovers(engine) != (0, []) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _leftovers(engine) == (0, [])
        assert engine.pipeline.runtime.orchestrator.flows.states == {}
        assert all(r.kv_blocks_total for r in engine.stats().replicas if r.stage != "code2wav")

        async def complete() -> list:
            async with aclosing(engine.generate(_request(engine, STREAMS + 1, 8))) as stream:
                return [out async for out in stream]

        outs = asyncio.run(complete())
        assert outs[-1].finished and outs[-1].finish_reason in (FinishReason.LENGTH, FinishReason.STOP)
        assert any(o.audio is not None and o.audio.size for o in outs)
        print(f"{STREAMS} cancelled streams in {elapsed:.1f} s; deltas read before leaving: {dict(seen)}")
        assert seen["audio"] > 0  # some were left while code2wav was busy with them
    finally:
        asyncio.run(engine.shutdown())
