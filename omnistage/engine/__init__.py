"""Stage engines: requests, token-budget scheduling, paged KV bookkeeping, the step loop."""

from omnistage.engine.config import EngineConfig
from omnistage.engine.engine_core import EngineCore
from omnistage.engine.outputs import ModelRunnerOutput, RequestOutput, ScheduledRequest, SchedulerOutput
from omnistage.engine.request import FinishReason, Request, RequestStatus
from omnistage.engine.scheduler import Scheduler

__all__ = [
    "EngineConfig", "EngineCore", "FinishReason", "ModelRunnerOutput", "Request", "RequestOutput",
    "RequestStatus", "ScheduledRequest", "Scheduler", "SchedulerOutput",
]
