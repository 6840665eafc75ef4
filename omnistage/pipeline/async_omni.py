"""``AsyncOmni``: the pipeline behind asyncio (the ``OmniEngine`` the OpenAI server is written against).

Deltas cross from the orchestrator's thread into the caller's event loop with
``call_soon_threadsafe``, so neither side ever blocks the other. A stream the
caller leaves before its end aborts its request in every stage.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

from omnistage.config.pipeline import PipelineSpec
from omnistage.core import OmniOutput, OmniRequest
from omnistage.pipeline.reports import EngineStats, HealthReport
from omnistage.pipeline.engine import OmniPipeline
from omnistage.pipeline.serve_flags import PipelineConfig
from omnistage.pipeline.runtime import PipelineOptions
from omnistage.families.base import FrontEnd
from omnistage.sampling_params import SamplingParams


class AsyncOmni:
    def __init__(self, model: str | Path = "tiny", stage_config: str | Path | PipelineSpec | None = None,
                 options: PipelineOptions | None = None, model_name: str | None = None,
                 *, pipeline: OmniPipeline | None = None) -> None:
        self.pipeline = pipeline or OmniPipeline(model, stage_config, options, model_name)
        self.model_name: str = self.pipeline.model_name
        self.front_end: FrontEnd = self.pipeline.front_end
        self.supports_audio: bool = self.pipeline.supports_audio
        self.max_model_len: int = self.pipeline.max_model_len
        self.default_sampling: SamplingParams = self.pipeline.default_sampling

    @classmethod
    def from_config(cls, config: PipelineConfig) -> AsyncOmni:
        """The pipeline ``omnistage serve`` was asked for (:func:`~omnistage.pipeline.serve_flags.pipeline_config_from_args`)."""
        return cls(pipeline=OmniPipeline.from_config(config))

    async def generate(self, request: OmniRequest) -> AsyncIterator[OmniOutput]:
        loop = asyncio.get_running_loop()
        outputs: asyncio.Queue[OmniOutput] = asyncio.Queue()

        def sink(output: OmniOutput) -> None:
            loop.call_soon_threadsafe(outputs.put_nowait, output)

        self.pipeline.submit(request, sink)
        finished = False
        try:
            while not finished:
                output = await outputs.get()
                finished = output.finished
                yield output
        finally:
            if not finished:  # the caller left early (closed, cancelled): free every stage
                self.pipeline.abort(request.request_id)

    async def abort(self, request_id: str) -> None:
        self.pipeline.abort(request_id)

    def health(self) -> HealthReport:
        return self.pipeline.health()

    def stats(self) -> EngineStats:
        return self.pipeline.stats()

    async def shutdown(self) -> None:
        await asyncio.to_thread(self.pipeline.close)
