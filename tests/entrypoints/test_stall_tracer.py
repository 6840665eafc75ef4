"""``--trace-loop-stalls-ms``: a stalled event loop is logged with the stack that stalled it."""

from __future__ import annotations

import asyncio
import logging
import time

import pytest

from omnistage.entrypoints.openai.common.stall_tracer import stall_tracer
from omnistage.entrypoints.openai.server_config import ServingOptions

LOGGER = "omnistage.entrypoints.openai.common.stall_tracer"


def _blocks_the_loop_for_a_known_while() -> None:
    time.sleep(0.3)


def _spins_on_the_loop() -> None:
    deadline = time.monotonic() + 0.3
    while time.monotonic() < deadline:  # pure Python: holds the GIL but for the interpreter's switches
        pass


async def _traced(blocker: object, threshold_ms: float = 100.0) -> int:
    async with stall_tracer(threshold_ms) as tracer:
        assert tracer is not None
        await asyncio.sleep(0.1)
        blocker()  # type: ignore[operator]
        await asyncio.sleep(0.3)  # the loop beats again: the stall is logged
        return tracer.reports


@pytest.mark.parametrize("blocker", [_blocks_the_loop_for_a_known_while, _spins_on_the_loop])
def test_a_stall_is_logged_naming_the_function_that_blocked_the_loop(blocker: object,
                                                                     caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        reports = asyncio.run(_traced(blocker))
    lines = [r.getMessage() for r in caplog.records if r.name == LOGGER]
    assert reports == 1 and len(lines) == 1
    assert blocker.__name__ in lines[0] and "[loop]" in lines[0]  # type: ignore[attr-defined]
    stalled_ms = float(lines[0].split("stalled ")[1].split(" ms")[0])
    assert 200 <= stalled_ms < 2000
    loop_cpu_ms = float(lines[0].split("loop thread on CPU ")[1].split(" ms")[0])
    if blocker is _blocks_the_loop_for_a_known_while:  # asleep: the stall's time is not the loop's CPU
        assert loop_cpu_ms < 150


def test_a_loop_that_keeps_beating_logs_nothing(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        reports = asyncio.run(_traced(lambda: None, threshold_ms=250.0))
    assert reports == 0 and not [r for r in caplog.records if r.name == LOGGER]


def test_the_tracer_is_off_unless_asked() -> None:
    async def off() -> object:
        async with stall_tracer(0) as tracer:
            return tracer

    assert asyncio.run(off()) is None
    assert ServingOptions().trace_loop_stalls_ms == 0
    with pytest.raises(ValueError, match="trace-loop-stalls-ms"):
        ServingOptions(trace_loop_stalls_ms=-1)
