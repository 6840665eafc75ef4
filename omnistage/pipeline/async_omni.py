"""``AsyncOmni``: the pipeline behind asyncio (the ``OmniEngine`` the OpenAI server is written against).

Deltas cross from the orchestrator's thread into the caller's event loop through a :class:`LoopMailbox`: the
orchestrator appends, and the loop is woken once for everything appended before it runs (a
``call_soon_threadsafe`` per delta is a write to the loop's wake-up pipe and a loop pass each), so neither side
ever blocks the other. A request's deltas that queued while its caller was busy reach it as one (their text,
tokens and audio joined), as vLLM's output collector merges them. A stream the caller leaves before its end
aborts its request in every stage.
"""

from __future__ import annotations

import asyncio
import functools
import threading
import weakref
from collections.abc import AsyncIterator
from pathlib import Path

from omnistage.config.pipeline import PipelineSpec
from omnistage.core import OmniOutput, OmniRequest, PromptDelta
from omnistage.pipeline.reports import EngineStats, HealthReport
from omnistage.pipeline.engine import OmniPipeline
from omnistage.pipeline.request_state import TraceSink
from omnistage.pipeline.serve_flags import PipelineConfig
from omnistage.pipeline.runtime import PipelineOptions
from omnistage.families.base import FrontEnd
from omnistage.sampling_params import SamplingParams


class RequestOutputs:
    """One request's outputs on its event loop, taken all at once by its reader (what queued while it was busy
    goes as one delta). Lighter than an ``asyncio.Queue``, whose every put and get costs waiter bookkeeping: this
    runs for every delta of every stream. Used on the loop's thread only."""

    __slots__ = ("_items", "_waiter")

    def __init__(self) -> None:
        self._items: list[OmniOutput] = []
        self._waiter: asyncio.Future[None] | None = None

    def put(self, output: OmniOutput) -> None:
        self._items.append(output)
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def take(self) -> list[OmniOutput]:
        while not self._items:
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        items, self._items = self._items, []
        return items


class LoopMailbox:
    """Deltas for one event loop, handed over in batches: the first delta posted after a drain schedules the next
    drain, later ones ride along with it."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self._lock = threading.Lock()
        self._items: list[tuple[RequestOutputs, OmniOutput]] = []

    def post(self, outputs: RequestOutputs, output: OmniOutput) -> None:
        """From any thread."""
        with self._lock:
            self._items.append((outputs, output))
            if len(self._items) > 1:
                return  # a drain is already scheduled
        self.loop.call_soon_threadsafe(self._drain)

    def _drain(self) -> None:
        with self._lock:
            items, self._items = self._items, []
        for outputs, output in items:
            outputs.put(output)


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
        self._mailboxes: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, LoopMailbox] = \
            weakref.WeakKeyDictionary()

    @classmethod
    def from_config(cls, config: PipelineConfig, trace_sink: TraceSink | None = None) -> AsyncOmni:
        """The pipeline ``omnistage serve`` was asked for
        (:func:`~omnistage.pipeline.serve_flags.pipeline_config_from_args`); ``trace_sink``: where finished
        requests' traces go when it traces."""
        return cls(pipeline=OmniPipeline.from_config(config, trace_sink))

    async def generate(self, request: OmniRequest) -> AsyncIterator[OmniOutput]:
        loop = asyncio.get_running_loop()
        mailbox = self._mailboxes.get(loop)
        if mailbox is None:
            mailbox = self._mailboxes[loop] = LoopMailbox(loop)
        outputs = RequestOutputs()
        self.pipeline.submit(request, functools.partial(mailbox.post, outputs))
        finished = False
        try:
            while not finished:
                output = OmniOutput.merge(await outputs.take())  # what queued while the caller was busy: one delta
                finished = output.finished
                yield output
        finally:
            if not finished:  # the caller left early (closed, cancelled): free every stage
                self.pipeline.abort(request.request_id)

    async def abort(self, request_id: str) -> None:
        self.pipeline.abort(request_id)

    def feed(self, request_id: str, delta: PromptDelta) -> None:
        """More input for a running request (text still being written); none once it ended."""
        self.pipeline.feed(request_id, delta)

    def health(self) -> HealthReport:
        return self.pipeline.health()

    def stats(self) -> EngineStats:
        return self.pipeline.stats()

    async def shutdown(self) -> None:
        await asyncio.to_thread(self.pipeline.close)
