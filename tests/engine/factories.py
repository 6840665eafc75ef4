"""Factories for scheduler and engine tests: requests, configs, and a runner with no model."""

from __future__ import annotations

from collections.abc import Callable

from omnistage.engine.config import EngineConfig
from omnistage.engine.outputs import ModelRunnerOutput, SchedulerOutput
from omnistage.engine.request import Request
from omnistage.engine.scheduler import Scheduler
from omnistage.sampling_params import SamplingParams

EOS = 2


def make_config(**overrides: object) -> EngineConfig:
    base: dict[str, object] = dict(block_size=4, num_blocks=33, max_num_seqs=8, max_num_batched_tokens=64,
                                   max_model_len=256)
    base.update(overrides)
    return EngineConfig(**base)


def make_request(
    request_id: str, prompt_len: int = 6, max_tokens: int | None = 8, first_token: int = 10, **params: object
) -> Request:
    prompt = [first_token + i for i in range(prompt_len)]
    sampling = SamplingParams(temperature=0.0, max_tokens=max_tokens, **params)
    return Request(request_id, prompt, sampling, eos_token_id=EOS)


def make_scheduler(**overrides: object) -> Scheduler:
    return Scheduler(make_config(**overrides))


def default_token(request: Request) -> int:
    """A deterministic next token that is never EOS: depends on the request's length only."""
    return 100 + request.num_tokens % 50


class FakeRunner:
    """Stands in for a model runner: samples ``next_token(request)`` for each row that reaches its end.

    Records every scheduler output it sees, so tests can inspect what was batched.
    """

    def __init__(self, num_blocks: int, next_token: Callable[[Request], int] = default_token,
                 is_ready: Callable[[Request], bool] = lambda r: True) -> None:
        self.num_blocks = num_blocks
        self.next_token = next_token
        self._is_ready = is_ready
        self.steps: list[SchedulerOutput] = []
        self.dropped: list[str] = []

    def is_ready(self, request: Request) -> bool:
        return self._is_ready(request)

    def execute_model(self, sched: SchedulerOutput) -> ModelRunnerOutput:
        self.steps.append(sched)
        self.dropped.extend(sched.finished_req_ids)
        tokens = [self.next_token(e.request) if e.samples else -1 for e in sched.scheduled]
        return ModelRunnerOutput(tokens)


def step(scheduler: Scheduler, runner: FakeRunner) -> SchedulerOutput:
    """One schedule → fake run → update cycle, returning the schedule."""
    sched = scheduler.schedule()
    scheduler.update_from_output(sched, runner.execute_model(sched))
    return sched
