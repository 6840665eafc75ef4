"""``DuplexOmni``: a full-duplex family served by the duplex engine instead of a stage pipeline.

A family whose hooks give a ``duplex`` model (Moshi) has no request → reply pipeline: its sessions listen and
speak at once, one frame in and one out every tick. This is the :class:`~omnistage.entrypoints.openai.
engine_protocol.OmniEngine` the server is written against for such a model: its front end (marked ``duplex``,
so request-shaped routes refuse with a 400 saying where to go), health and stats of the engine's tick thread,
and ``sessions``, the calibrated :class:`DuplexEngine` that GPT-Live sessions open on. The engine ticks on its
own thread, off the event loop, from the moment the server has it until ``shutdown``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import replace
from pathlib import Path

from omnistage.core import OmniOutput, OmniRequest, PromptDelta
from omnistage.engine.duplex.admission import calibrate
from omnistage.engine.duplex.base import DuplexServed
from omnistage.engine.duplex.engine import DuplexEngine
from omnistage.families.base import FrontEnd, call_hook
from omnistage.families.registry import DEFAULT_REGISTRY, FamilyRegistry
from omnistage.pipeline.reports import EngineStats, HealthReport, ReplicaHealth, ReplicaStats, StageHealth
from omnistage.pipeline.serve_flags import PipelineConfig
from omnistage.sampling_params import SamplingParams

STAGE = "duplex"  # how health and /metrics name the engine
DEFAULT_SESSIONS = 16  # rows of session state loaded when --max-num-seqs does not say (admission may allow fewer)


def serves_duplex(model: str | Path, registry: FamilyRegistry = DEFAULT_REGISTRY) -> bool:
    """Whether a checkpoint's family is served by the duplex engine (its hooks give a ``duplex`` model)."""
    return bool(registry.for_folder(registry.resolve_model(model)).hooks.duplex)


class DuplexOmni:
    supports_audio = True
    default_sampling = SamplingParams()

    def __init__(self, model: str | Path, model_name: str | None = None, max_sessions: int = DEFAULT_SESSIONS,
                 dtype: str = "float32", budget: float = 0.75, clock: Callable[[], float] = time.monotonic,
                 registry: FamilyRegistry = DEFAULT_REGISTRY) -> None:
        """``budget``: the share of a frame a step may take (admission); ``clock``: the engine's wall clock."""
        folder = registry.resolve_model(model)
        family = registry.for_folder(folder)
        if not family.hooks.duplex:
            raise ValueError(f"the {family.name} family is not a duplex model")
        self.front_end: FrontEnd = replace(family.front_end(folder, family.load_config(folder)), duplex=True)
        self.model_name = model_name or str(model)
        self.max_model_len = self.front_end.max_positions
        self.served: DuplexServed = call_hook(family.hooks.duplex, folder, max_sessions, dtype)  # type: ignore[assignment]
        times = calibrate(self.served.model, codec=self.served.codec)  # before any session: admission's numbers
        self.sessions = DuplexEngine(self.served.model, times, budget=budget, clock=clock, codec=self.served.codec)
        self.sessions.start()

    @classmethod
    def from_config(cls, config: PipelineConfig) -> DuplexOmni:
        """``omnistage serve``'s flags: ``--max-num-seqs`` the session rows, ``--dtype`` the model's weights."""
        rows = dict(config.overrides.max_num_seqs)
        sessions = int(next(iter(rows.values()))) if len(rows) == 1 else DEFAULT_SESSIONS
        dtype = config.overrides.dtype if config.overrides.dtype not in ("", "auto") else "float32"
        return cls(config.model, config.model_name, sessions, dtype)

    async def generate(self, request: OmniRequest) -> AsyncIterator[OmniOutput]:
        # Every request-shaped route refuses a duplex front end first; reaching here is a route's bug.
        raise TypeError(f"{self.model_name} is a duplex model: it serves GPT-Live sessions, not requests")
        yield  # pragma: no cover - makes this an async generator

    async def abort(self, request_id: str) -> None:
        return None

    def feed(self, request_id: str, delta: PromptDelta) -> None:
        return None

    def health(self) -> HealthReport:
        alive = self.sessions.running
        replica = ReplicaHealth(0, alive, "" if alive else "the duplex engine's tick thread has stopped")
        return HealthReport((StageHealth(STAGE, (replica,)),))

    def stats(self) -> EngineStats:
        live = self.sessions.live
        return EngineStats((ReplicaStats(STAGE, 0, 0, 0, queue_depth=0, running=live),))

    async def shutdown(self) -> None:
        await asyncio.to_thread(self.sessions.stop)
