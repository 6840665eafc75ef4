"""Streaming input: a realtime session's user turn is encoded and prefilled while the user is still speaking.

From the VAD's speech start, each time the input audio completes one of the
audio encoder's attention windows (Qwen3-Omni: 8 s), its log-mel is frozen
(:class:`~omnistage.processing.listened_audio.WindowedLogMel`) and a
*prefill request* goes to the engine: the prompt the turn's response would
have if the user stopped now at that window (the conversation so far, the
live item's audio cut at the window), one token. It runs in the engine's
ordinary batched steps (chunked prefill beside other sessions' decodes) and
leaves its blocks in the thinker's prefix cache, keyed by the windows'
content, when it finishes. When the session's replies speak it also asks for
audio, prefill-only (``OmniRequest.prefill_only``: no audio is made), so the
talker caches its user rows too (keyed by the thinker prefix they come from).
At the end of the turn the committed item carries the frozen windows
(:class:`ListenedAudio`), so the response's prompt has the same features and
keys for them: the prefix caches serve the conversation and the completed
windows, and only the last partial window and the assistant prefix are encoded
and prefilled after the user stops.

At the speech start a first prefill request carries the conversation so far
with the live user turn's opening (its role header), before any of its audio:
the earlier turns (their audio, the replies' transcripts as the template
renders them) are then cached by the time the user stops, however short the
new turn is. One prefill request runs per session at a time; a later window
supersedes a pending one. A cleared buffer or a VAD reset cancels the one in
flight (its engine request is aborted in every stage and its blocks freed). A
commit lets it finish: the response's prompt extends it, so the response waits
for it (:meth:`Listener.settle`) rather than redo its work; so does a speculative reply started at a pause
(``speculation.py``), for the one in flight then.
Without turn detection (the client commits) the live item is the whole buffer,
from its first append. The switch is per session (``session.streaming_input``)
over the server's default (``serve --no-streaming-input``); transcription
sessions do not stream (they never answer).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Coroutine
from contextlib import aclosing
from typing import Any

import numpy as np
import torch

from omnistage.core import OmniRequest
from omnistage.entrypoints.openai.common.decode_pool import CancelToken, DecodePool
from omnistage.entrypoints.openai.common.streaming import engine_outputs
from omnistage.entrypoints.openai.engine_protocol import OmniEngine
from omnistage.entrypoints.openai.realtime.conversation import InputBuffer
from omnistage.processing.listened_audio import ListenedAudio, StreamingAudioInput, WindowedLogMel
from omnistage.processing.prompt import AUDIO_SAMPLE_RATE

logger = logging.getLogger(__name__)

# Builds a prefill request for the live item's audio so far (its audio None: the conversation before the live turn's
# audio); the request None: nothing to prefill (e.g. no conversation yet).
PrefillRequest = Callable[[ListenedAudio | None], Awaitable[OmniRequest | None]]


class Listener:
    """One session's streaming input: the frozen windows of the live item and its prefill requests."""

    def __init__(self, engine: OmniEngine, pool: DecodePool, prefill: PrefillRequest) -> None:
        self.engine, self.pool, self.prefill = engine, pool, prefill
        processor = engine.front_end.processor
        self.processor = processor if isinstance(processor, StreamingAudioInput) else None
        self._mel: WindowedLogMel | None = None
        self._start = 0  # the buffer sample (since its last clear) where the live item starts
        self._hop = 1  # input samples per mel frame
        self._task: _Job | None = None
        self._settling: _Job | None = None  # a committed item's prefill, left to finish
        self.prefilled_windows = 0  # windows whose prefill request finished (all sessions' turns)

    @property
    def active(self) -> bool:
        return self._mel is not None

    def begin(self, start: int) -> None:
        """Speech started: the item will begin at buffer sample ``start`` (its prefix padding included)."""
        self.discard()
        if self.processor is not None:
            self._mel = self.processor.listener()
            self._start = start
        if self._mel is not None:
            self._hop = self._mel.extractor.hop_length
            # The conversation so far, as the turn begins.
            self._task = _Job(lambda primed: self._run(None, primed))

    def heard(self, buffer: InputBuffer) -> None:
        """The buffer grew: starts freezing and prefilling any window it completed (one job at a time)."""
        mel = self._mel
        if mel is None or (self._task is not None and not self._task.done()):
            return
        available = buffer.samples + buffer.dropped - self._start
        if mel.completed(available * AUDIO_SAMPLE_RATE // buffer.rate) <= len(mel.windows):
            return
        # Joined in the pool: a long turn's buffer is tens of MB, and copying it on the event loop stalled it.
        pieces = list(buffer.pieces)
        skip, to_16k = max(0, self._start - buffer.dropped), buffer.format.to_16k
        self._task = _Job(lambda primed: self._prefill(mel, pieces, skip, to_16k, primed))

    async def _prefill(self, mel: WindowedLogMel, pieces: list[np.ndarray], skip: int,
                       to_16k: Callable[[np.ndarray], np.ndarray], primed: asyncio.Future[None]) -> None:
        try:
            samples = await self.pool.run(_freeze_job, mel, pieces, skip, to_16k)
        except asyncio.CancelledError:
            raise
        except Exception:  # noqa: BLE001 - speculative work: the turn's own response still runs without it
            logger.exception("streaming input features failed; the turn is prefilled when it ends")
            return
        head = mel.head()
        if head is not None and await self._run(ListenedAudio(samples[:head.shape[1] * mel.extractor.hop_length],
                                                              head), primed):
            self.prefilled_windows += 1

    async def _run(self, cut: ListenedAudio | None, primed: asyncio.Future[None]) -> bool:
        """Runs the prefill request of the live item cut at ``cut`` (None: before its audio); True when it ran.
        ``primed`` is resolved at an output before its last: the thinker's part is done, its talker's goes on."""
        try:
            request = await self.prefill(cut)
            if request is None:
                return False
            async with aclosing(engine_outputs(self.engine, request)) as outputs:
                async for out in outputs:
                    if not out.finished:  # its last output: primed when the task has ended, all closed
                        _resolve(primed)
            return True
        except asyncio.CancelledError:
            raise
        except Exception:  # noqa: BLE001 - speculative work: the turn's own response still runs without it
            logger.exception("streaming input prefill failed; the turn is prefilled when it ends")
            return False

    def take(self, audio: np.ndarray) -> ListenedAudio | None:
        """At commit, the item's 16 kHz audio with its frozen windows (None when none completed); the in-flight
        prefill is left to finish (:meth:`settle`), and listening stops until the next speech."""
        head, self._mel = self.head(), None
        task, self._task = self._task, None
        if task is not None and not task.done():
            self._settle_cancel()
            self._settling = task
        return self.listened(audio, head)

    def head(self) -> torch.Tensor | None:
        """The live item's frozen windows so far (None: none yet)."""
        return None if self._mel is None else self._mel.head()

    def listened(self, audio: np.ndarray, head: torch.Tensor | None) -> ListenedAudio | None:
        """``audio`` (16 kHz, from the item's start) with the windows ``head`` froze; None when it has none or they
        reach past its end."""
        if head is None or head.shape[1] * self._hop > len(audio):
            return None
        return ListenedAudio(audio, head)

    def in_flight(self) -> asyncio.Future[None] | None:
        """The prefill running now, done once its thinker part is: a speculative reply's prompt extends it, so it
        waits for it as a commit's response does (:meth:`settle`), with ``asyncio.wait`` (which leaves it running
        when the waiter is cancelled)."""
        job = self._task
        return job.primed if job is not None and not job.primed.done() else None

    def discard(self) -> None:
        """The live item is gone (buffer cleared, VAD reset): its frozen windows and in-flight prefill too."""
        self._mel = None
        self._cancel()

    async def settle(self) -> None:
        """Waits for the committed item's prefill still in flight, until its thinker part is done: a response's
        prompt extends it, and the thinker's prefix cache serves the response only the blocks a finished (or
        running) prefill computed. Its talker part, if any, goes on beside the response's thinker prefill: the
        talker's cache holds its rows from the step that starts computing them, before the response's talker
        start can ask."""
        job, self._settling = self._settling, None
        if job is not None and not job.primed.done():
            await asyncio.wait({job.primed})  # a cancelled caller leaves it running: its work stays cached

    def _cancel(self) -> None:
        task, self._task = self._task, None
        if task is not None and not task.done():
            task.cancel()  # aclosing(engine_outputs) aborts the request in every stage

    def _settle_cancel(self) -> None:
        task, self._settling = self._settling, None
        if task is not None and not task.done():
            task.cancel()

    async def close(self) -> None:
        tasks = [j.task for j in (self._task, self._settling) if j is not None]
        self.discard()
        self._settle_cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task


def _freeze_job(mel: WindowedLogMel, pieces: list[np.ndarray], skip: int,
                to_16k: Callable[[np.ndarray], np.ndarray], token: CancelToken) -> np.ndarray:
    token.check()
    samples = to_16k(np.concatenate(pieces)[skip:])
    mel.advance(samples)
    return samples


class _Job:
    """One prefill request's task, and ``primed``: resolved once its thinker part is done (its one token came
    back) or the task ended, however."""

    def __init__(self, run: Callable[[asyncio.Future[None]], Coroutine[Any, Any, object]]) -> None:
        self.primed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.task = asyncio.create_task(run(self.primed))
        self.task.add_done_callback(lambda _: _resolve(self.primed))

    def done(self) -> bool:
        return self.task.done()

    def cancel(self) -> None:
        self.task.cancel()


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)
