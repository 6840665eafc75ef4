"""A stage's decode step time at several batch sizes, measured once at startup on synthetic requests.

What one more stream costs a batched stage is the step time's growth with the batch, which serving measures
only after it admitted that stream. The admission gate (:mod:`omnistage.pipeline.audio_gate`) takes the shape of
this curve from here, measured before the first request, and the level from the running streams.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence

from omnistage.engine.engine_core import EngineCore
from omnistage.engine.request import Request

WARM_TOKENS = 2  # decode steps run before timing (prefill done, first-call work out of the way)
MAX_SETUP_STEPS = 64  # a prefill longer than this (chunked) is not a profile's business: give up on that size


def profile_batches(max_batch: int) -> list[int]:
    """1, 2, 4, ... up to ``max_batch`` (which is included)."""
    sizes, n = [], 1
    while n < max_batch:
        sizes.append(n)
        n *= 2
    return sizes + [max_batch] if max_batch >= 1 else []


def measure_decode_steps(engine: EngineCore, make_request: Callable[[str], Request], batches: Sequence[int],
                         steps: int = 3) -> dict[int, float]:
    """Median seconds of one decode step with ``n`` running requests, for each ``n`` in ``batches``.

    The requests (``make_request(id)``, which must not stop before ``WARM_TOKENS + steps`` tokens) are aborted
    after each size, so the engine is left as it was found: empty, its blocks free.
    """
    seconds: dict[int, float] = {}
    for n in batches:
        requests = [make_request(f"step-profile-{n}-{i}") for i in range(n)]
        for request in requests:
            engine.add_request(request)
        try:
            for _ in range(MAX_SETUP_STEPS):
                if all(r.num_output_tokens >= WARM_TOKENS for r in requests):
                    break
                engine.step()
            else:
                break
            times = []
            for _ in range(steps):
                start = time.perf_counter()
                engine.step()
                times.append(time.perf_counter() - start)
            seconds[n] = statistics.median(times)
        finally:
            for request in requests:
                engine.abort_request(request.request_id)
            engine.step()  # hands the aborted requests to the runner, which drops their state
    return seconds
