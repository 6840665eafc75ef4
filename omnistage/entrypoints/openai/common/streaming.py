"""Tying a request's life to its client: whoever stops listening, the engine stops working.

Every way a request can be left unfinished ends in ``engine.abort``, called from
``engine_outputs``'s ``finally``: a streamed response whose client goes away
(Starlette cancels the body iterator, and ``AbortingStreamingResponse`` closes
it and what it wraps), a client that goes away while the server waits for a
whole reply or for a stream's first item (``run_until_disconnect``, ``peek``),
and any error while the engine is being read. The abort runs in a shielded
scope because it happens during cancellation.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable
from typing import TypeVar

import anyio
from fastapi import Request
from pydantic import BaseModel
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from omnistage.core import FinishReason, OmniOutput, OmniRequest
from omnistage.entrypoints.openai.common.admission import Ticket
from omnistage.entrypoints.openai.engine_protocol import OmniEngine

T = TypeVar("T")
TIMED_OUT = "request timed out"  # the error of a final output ``engine_outputs`` made at the deadline


class ClientDisconnected(Exception):
    """The client closed the connection before the response was ready."""


async def engine_outputs(engine: OmniEngine, request: OmniRequest, *, timeout_s: float | None = None,
                         ticket: Ticket | None = None) -> AsyncGenerator[OmniOutput, None]:
    """``engine.generate`` that aborts the request unless it was read to its finished output.

    Past ``timeout_s`` the request is aborted and a final output with ``TIMED_OUT`` as its error ends the
    stream; ``ticket`` (its admission) is released however the stream ends."""
    finished = False
    stream = engine.generate(request)
    deadline = _Deadline(timeout_s)
    try:
        while True:
            try:
                out = await deadline.wait(anext(stream))
            except StopAsyncIteration:
                return
            except TimeoutError:
                yield OmniOutput(request.request_id, finished=True, finish_reason=FinishReason.ABORT,
                                 error=f"{TIMED_OUT} after {timeout_s:g} s")
                return  # not ``finished``: the finally aborts it in every stage
            finished = out.finished
            yield out
            if finished:
                return
    finally:
        deadline.cancel()
        with anyio.CancelScope(shield=True):
            if ticket is not None:
                ticket.release()
            if not finished:
                await engine.abort(request.request_id)
            aclose = getattr(stream, "aclose", None)
            if aclose is not None:
                await aclose()


class _Deadline:
    """A request's deadline as one timer for its whole stream: when it passes while the stream is awaited, the
    waiting task is cancelled and the wait raises ``TimeoutError``; once past, every later wait does. A timeout per
    awaited output (``wait_for``: a task each; ``asyncio.timeout``: a timer each) cost as much as the output's own
    handling. The waiting task is taken at each wait (a stream may be read from more than one task)."""

    def __init__(self, timeout_s: float | None) -> None:
        self.expired = False
        self._waiting: asyncio.Task[object] | None = None
        self._cancelled = False
        self._handle = None if timeout_s is None else asyncio.get_running_loop().call_later(timeout_s, self._expire)

    def _expire(self) -> None:
        self.expired = True
        if self._waiting is not None:
            self._cancelled = True
            self._waiting.cancel()

    async def wait(self, awaitable: Awaitable[T]) -> T:
        if self.expired:
            close = getattr(awaitable, "close", None)
            if close is not None:
                close()  # never awaited: no "never awaited" warning
            raise TimeoutError
        self._waiting = asyncio.current_task()
        try:
            return await awaitable
        except asyncio.CancelledError:
            if self._cancelled and self._waiting is not None and self._waiting.uncancel() == 0:
                raise TimeoutError from None  # our cancellation, not the caller's
            raise
        finally:
            self._waiting, self._cancelled = None, False

    def cancel(self) -> None:
        if self._handle is not None:
            self._handle.cancel()


async def _wait_for_disconnect(request: Request) -> None:
    # The body is already read, so the next ASGI message can only be the disconnect.
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


async def run_until_disconnect(request: Request, work: Awaitable[T]) -> T:
    """Awaits ``work`` unless the client disconnects first; then ``work`` is cancelled."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_wait_for_disconnect(request))
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
        if not task.done():
            task.cancel()
            # Let the cancelled work run its cleanup (the engine abort) before answering.
            with contextlib.suppress(asyncio.CancelledError):
                await task
    if task.cancelled():
        raise ClientDisconnected()
    return task.result()


async def prepare_admitted(request: Request, ticket: Ticket, work: Awaitable[T]) -> T:
    """An admitted request's preparation (decoding, tokenising), until its client leaves
    (``ClientDisconnected``); on any failure its admission ticket goes back before the error propagates."""
    try:
        return await run_until_disconnect(request, work)
    except BaseException:
        ticket.release()
        raise


async def peek(request: Request, items: AsyncGenerator[T, None]) -> tuple[T | None, AsyncGenerator[T, None]]:
    """Waits for the first item before any header is sent, so a failure up to then can still be
    an HTTP error; returns it (None if there is none) and a generator yielding it and the rest."""
    first = await run_until_disconnect(request, anext(items, None))

    async def chained() -> AsyncGenerator[T, None]:
        async with contextlib.aclosing(items):
            if first is not None:
                yield first
            async for item in items:
                yield item

    return first, chained()


class AbortingStreamingResponse(StreamingResponse):
    """A StreamingResponse that always closes its body iterator, and ``upstream`` if given, so their
    cleanup (the engine abort) runs even when the client left before or while a chunk was sent.
    ``upstream`` matters when the body wraps a generator already started (see ``peek``): closing
    a wrapper that never ran does not reach the generator inside it."""

    def __init__(self, content: AsyncIterator[str] | AsyncIterator[bytes], *, media_type: str,
                 upstream: AsyncGenerator[object, None] | None = None, ticket: Ticket | None = None) -> None:
        super().__init__(content, media_type=media_type)
        self.upstream = upstream
        self.ticket = ticket  # released even if the body never started (the client left first)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            with anyio.CancelScope(shield=True):
                for iterator in (self.body_iterator, self.upstream):
                    aclose = getattr(iterator, "aclose", None)
                    if aclose is not None:
                        await aclose()
                if self.ticket is not None:
                    self.ticket.release()


def sse_event(payload: BaseModel) -> str:
    """One server-sent event; ``None`` fields are left out, as OpenAI's own stream does."""
    return f"data: {payload.model_dump_json(exclude_none=True)}\n\n"


SSE_DONE = "data: [DONE]\n\n"
