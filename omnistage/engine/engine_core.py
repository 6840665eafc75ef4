"""One stage's engine: the pure step loop over a scheduler and a model runner.

``step()`` is schedule → run → update, nothing else; process boundaries, I/O
threads and streaming live above this class.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Protocol

from omnistage.engine.config import EngineConfig
from omnistage.engine.outputs import ModelRunnerOutput, RequestOutput, SchedulerOutput
from omnistage.engine.request import Request
from omnistage.engine.scheduler import Scheduler


class StepRunner(Protocol):
    """What the engine needs from a runner (``omnistage.runner.ar_runner.ARModelRunner`` or a fake)."""

    num_blocks: int

    def execute_model(self, sched: SchedulerOutput) -> ModelRunnerOutput: ...

    def is_ready(self, request: Request) -> bool: ...


class EngineCore:
    def __init__(self, runner: StepRunner, config: EngineConfig) -> None:
        self.config = config
        self.runner = runner
        # The runner sized the KV cache; the scheduler's block pool must mirror it exactly. A pool smaller than one
        # request of max_model_len (a CPU's default budget under a full-size model) ends a context where it is full
        # (finish reason "length") instead of preempting a lone request for ever.
        pool_tokens = (runner.num_blocks - 1) * config.block_size
        sched_config = replace(config, num_blocks=runner.num_blocks,
                               max_model_len=min(config.max_model_len, pool_tokens))
        self.scheduler = Scheduler(sched_config, is_ready=runner.is_ready)
        self.last_num_scheduled = 0
        self.last_schedule: SchedulerOutput | None = None  # the last step's (tracing reads whom it computed for)

    def add_request(self, request: Request) -> None:
        self.scheduler.add_request(request)

    def abort_request(self, request_id: str) -> bool:
        return self.scheduler.abort_request(request_id) is not None

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished_requests()

    def step(self) -> list[RequestOutput]:
        sched = self.last_schedule = self.scheduler.schedule()
        self.last_num_scheduled = len(sched.scheduled)
        if sched.is_empty and not sched.finished_req_ids:
            return []
        # An empty step still reaches the runner when it must drop finished requests' state.
        result = self.runner.execute_model(sched)
        return self.scheduler.update_from_output(sched, result)

    def run_until_done(self, max_idle_steps: int = 1000) -> list[RequestOutput]:
        """Steps until every request finished (tests, benchmarks, offline use)."""
        outputs: list[RequestOutput] = []
        idle = 0
        while self.has_unfinished_requests():
            new = self.step()
            idle = 0 if self.last_num_scheduled else idle + 1
            if idle > max_idle_steps:
                raise RuntimeError("engine made no progress: every running request is waiting on its stage hook")
            outputs.extend(new)
        return outputs

