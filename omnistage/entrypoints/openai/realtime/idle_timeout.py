"""server_vad's ``idle_timeout_ms``: when the user stays silent that long after a reply has played, the session
prompts a response itself, as OpenAI's does (a phone call where a long pause is unexpected).

The clock starts when a response ends, plus the audio it still has to play (its audio seconds less the time since
it started: a client plays as it receives). Speech starting, another response starting, or the turn detection
changing stops it. When it runs out with no response running and no speech in progress, the session sends
``input_audio_buffer.timeout_triggered`` (the idle stretch of the input buffer, ``audio_start_ms`` to
``audio_end_ms``), commits that stretch as the user's item (silence, when the client sent none) and, with
``create_response``, answers it (``SessionAudio._idle_timed_out``).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Coroutine
from typing import Any


class IdleTimeout:
    """One pending timeout at most."""

    def __init__(self) -> None:
        self._task: asyncio.Task[None] | None = None

    def arm(self, delay_s: float, fire: Callable[[], Coroutine[Any, Any, None]]) -> None:
        self.cancel()
        self._task = asyncio.create_task(self._wait(delay_s, fire))

    @staticmethod
    async def _wait(delay_s: float, fire: Callable[[], Coroutine[Any, Any, None]]) -> None:
        await asyncio.sleep(delay_s)
        await fire()

    @property
    def armed(self) -> bool:
        return self._task is not None and not self._task.done()

    def cancel(self) -> None:
        task, self._task = self._task, None
        if task is not None and not task.done() and task is not asyncio.current_task():
            task.cancel()

    async def close(self) -> None:
        task = self._task
        self.cancel()
        if task is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await task
