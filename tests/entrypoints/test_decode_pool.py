"""The bounded decode pool: large-media jobs run one at a time, the other workers stay free for small ones."""

from __future__ import annotations

import asyncio
import threading
import time

from omnistage.entrypoints.openai.common.decode_pool import LARGE_JOB_BYTES, CancelToken, DecodePool


class _Overlap:
    """Counts how many jobs run at once."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.running = self.most = 0

    def job(self, hold_s: float, token: CancelToken) -> None:
        with self._lock:
            self.running += 1
            self.most = max(self.most, self.running)
        time.sleep(hold_s)
        with self._lock:
            self.running -= 1


def test_large_jobs_run_one_at_a_time_while_small_ones_still_run_beside_them() -> None:
    pool = DecodePool(4)
    large, small = _Overlap(), _Overlap()

    async def scenario() -> None:
        jobs = [pool.run_sized(LARGE_JOB_BYTES + 1, large.job, 0.05) for _ in range(4)]
        jobs += [pool.run_sized(LARGE_JOB_BYTES, small.job, 0.3) for _ in range(2)]  # at the bound: not large
        await asyncio.gather(*jobs)

    try:
        asyncio.run(scenario())
    finally:
        pool.shutdown()
    assert large.most == 1 and large.running == 0
    assert small.most == 2  # both ran at once, beside the large ones (4 workers)
