"""A speculative reply: a turn's response started when the user pauses, before server VAD ends the turn.

With streaming input and server VAD on (and ``create_response``), the VAD reports a
*pause* once a turn has been silent for ``speculative_reply_ms`` (``VadConfig.pause_ms``),
before its ``silence_duration_ms`` commits it. At the pause, with no response in
progress, the session builds the user item a commit would make, its audio cut at
what the VAD had heard, and the response's request to it as a commit would (the
conversation with that item added, the session's response options, tools and
sampling), and submits it under an admission ticket (refused: no speculation). Its
outputs are held here; no client event is sent.

If the turn ends with nothing changed, the committed item *is* that item (the
audio after the pause, silence by the VAD's account, is dropped with the buffer),
so the reply is exactly the reply to the committed item; the session then sends
the usual events in OpenAI's order (``speech_stopped``, ``committed``, the item's,
``response.created``) and the response reads the held outputs at once, then the
rest as they come. The thinker's prefill, the talker's first frames and code2wav's
first chunk run during the rest of the silence wait; since the client plays the
reply only from the turn's end, its request says when that is expected
(``OmniRequest.plays_at``: the rest of the silence after the pause). Started
before then (not held that long by the audio gate), it has a head start: half
the stage's unloaded first chunk at any load, so at concurrency 1 it fits in
that wait. Voice coming back
(``speech_resumed``), any client event but an append, a cleared buffer or the
session's end cancels it: the request is aborted in every stage (its KV blocks
freed) and the client never hears of it.

Under ``semantic_vad`` the reply starts at the detector's first silent frame (Silero's 32 ms
window: ``SEMANTIC_SPECULATE_MS``), before the Smart Turn classifier is first
asked (at 128 ms, then as the silence doubles: ``audio/vad.py``). Its "complete" ends
the turn, and the commit takes the reply already running; while it says "incomplete"
the reply waits, held, and voice coming back drops it unheard (a pause inside a
sentence costs the server a dropped reply, never the user a false start). A pause starts one only
where the server has headroom (``speculation_gate.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncGenerator, Awaitable, Callable
from contextlib import aclosing
from dataclasses import dataclass

from omnistage.core import OmniOutput, OmniRequest
from omnistage.entrypoints.openai.common.admission import Ticket
from omnistage.entrypoints.openai.common.streaming import engine_outputs
from omnistage.entrypoints.openai.engine_protocol import OmniEngine
from omnistage.entrypoints.openai.realtime.items import Item
from omnistage.entrypoints.openai.realtime.protocol import ResponseOptions

logger = logging.getLogger(__name__)
CountOutcome = Callable[[str], None]  # told "used" or "dropped" once per speculative reply (``/metrics``)


def ignore_outcome(outcome: str) -> None:
    """No metrics (an app built without them)."""


@dataclass(frozen=True)
class SpeculativeTurn:
    """What a speculative reply answers, and its request."""

    item: Item  # the user item the commit will add
    options: ResponseOptions  # the response's options when it started
    items: tuple[Item, ...]  # the conversation its prompt renders (``item`` last)
    request: OmniRequest
    dropped: tuple[Item, ...]  # the oldest items its prompt left out to fit the context

    def answers(self, options: ResponseOptions, items: tuple[Item, ...]) -> bool:
        """The response a commit starts would be this one: same options, the same item objects in order."""
        return options == self.options and len(items) == len(self.items) and all(
            a is b for a, b in zip(items, self.items))


class _End:
    """The held outputs end here (an error raised by the engine rides along)."""

    def __init__(self, error: Exception | None = None) -> None:
        self.error = error


class Speculation:
    """One speculative reply: built by ``build``, run under ``ticket``, its outputs held until read."""

    def __init__(self, build: Callable[[], Awaitable[SpeculativeTurn]], engine: OmniEngine, ticket: Ticket,
                 timeout_s: float | None, count: CountOutcome = ignore_outcome) -> None:
        self.ticket, self._count = ticket, count
        self._outcome = ""  # "used" once a response reads it, else "dropped" once cancelled
        self.turn: SpeculativeTurn | None = None
        self._held: asyncio.Queue[OmniOutput | _End] = asyncio.Queue()
        self._built = asyncio.Event()
        self._task = asyncio.create_task(self._run(build, engine, timeout_s))

    async def _run(self, build: Callable[[], Awaitable[SpeculativeTurn]], engine: OmniEngine,
                   timeout_s: float | None) -> None:
        end = _End()
        try:
            try:
                self.turn = await build()
            finally:
                self._built.set()
            # Unless read to its final output, the request is aborted in every stage when this ends (cancelled).
            async with aclosing(engine_outputs(engine, self.turn.request, timeout_s=timeout_s,
                                               ticket=self.ticket)) as outputs:
                async for out in outputs:
                    self._held.put_nowait(out)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - a failed build leaves the commit to the ordinary path
            if self.turn is None:
                logger.warning("speculative reply not built (the commit builds its own): %s", exc)
            end = _End(exc)
        finally:
            self.ticket.release()
            self._held.put_nowait(end)

    async def ready(self) -> SpeculativeTurn | None:
        """The built turn, once built; None when its build failed (or it was cancelled first)."""
        await self._built.wait()
        return self.turn

    async def outputs(self) -> AsyncGenerator[OmniOutput, None]:
        """The held outputs, then the rest as they come; closing it early cancels the request."""
        self._settle("used")
        try:
            while True:
                out = await self._held.get()
                if isinstance(out, _End):
                    if out.error is not None:
                        raise out.error
                    return
                yield out
        finally:
            self.cancel()

    def _settle(self, outcome: str) -> None:
        if not self._outcome:
            self._outcome = outcome
            self._count(outcome)

    def cancel(self) -> None:
        """Aborts the request (in every stage, its blocks freed) unless it already ended."""
        self._settle("dropped")
        self._task.cancel()
        self._built.set()  # a commit waiting for the build goes the ordinary way

    async def close(self) -> None:
        self.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
