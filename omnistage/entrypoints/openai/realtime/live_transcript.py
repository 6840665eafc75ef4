"""Input audio transcription while the user speaks: ``conversation.item.input_audio_transcription.delta`` events
of the turn in progress, before its commit.

From the VAD's speech start, each time the turn has grown by a step of audio, the session's transcription model
writes down the turn so far (one text-only request, as the commit's in ``transcribe.py``). What two runs in a row
agree on (their common opening, in whole words, never the last word heard) is sent as a delta and fixed: later
runs are prompted with the fixed text as the transcript's opening, so they write only its continuation, and so
does the commit's run, so the deltas join into the ``.completed`` transcript exactly. This is whisper-streaming's
local agreement, with the fixed text given back as the reply's opening as qwen-asr's streaming re-runs do.

Bounded so that it never starves replies: one run per session at a time; a step of ``max(1 s, a quarter of the
turn heard)``, so all of a turn's runs together read about five times its audio at most; a run takes a place under
the server's admission bound only while more than half of it is free, and is skipped (never refused) otherwise;
none runs while the session's response does. Only with turn detection: the VAD names the turn's item at its
start (``speech_started``), so the deltas can name it before it is committed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
from typing import TYPE_CHECKING

from omnistage.entrypoints.openai.common.admission import Admission, Overloaded, Ticket
from omnistage.entrypoints.openai.common.transcriber import (
    TRANSCRIPTION_MODALITIES,
    TranscriptDelta,
    TranscriptDone,
    render_transcription,
    reply_reader,
    transcript_events,
    transcription_request,
)
from omnistage.entrypoints.openai.engine_protocol import OmniEngine
from omnistage.entrypoints.openai.realtime.conversation import InputBuffer
from omnistage.entrypoints.openai.realtime.protocol import new_id, server_event
from omnistage.entrypoints.openai.realtime.transcribe import Opening, ask_for, writer_of

if TYPE_CHECKING:
    from omnistage.entrypoints.openai.realtime.session_loop import RealtimeSession

logger = logging.getLogger(__name__)
MIN_STEP_S = 1.0  # audio a turn grows by before it is written down again
STEP_SHARE = 0.25  # ... or this share of the turn heard so far, when more: the runs' audio stays ~5x the turn's
# A word: a run of non-space characters with the space before it; in scripts written without spaces (Chinese,
# Japanese), each character and each of their punctuation marks is one.
_CJK = "\u3000-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\uff00-\uffef"
_WORD = re.compile(rf"\s*(?:[{_CJK}]|[^\s{_CJK}]+)")


def agreed(previous: str, current: str) -> str:
    """The opening two hypotheses of the same continuation share, in whole words (each with the space before it),
    never the current one's last word: the audio was cut there, and the word may still grow (a character whose
    bytes a token cut, U+FFFD until the next token completes it, is at the text's end, so in that word)."""
    before, now = _WORD.findall(previous), _WORD.findall(current)
    shared = 0
    for a, b in zip(before, now[:-1]):
        if a != b:
            break
        shared += 1
    return "".join(now[:shared])


class LiveTranscript:
    """One session's transcript of the turn being spoken."""

    def __init__(self, session: RealtimeSession) -> None:
        self.session = session
        self.item_id = ""  # the turn's item ("": no turn is being written down)
        self._start = 0  # the buffer sample (since its last clear) the item begins at
        self._heard_at = 0  # the buffer position the latest run read up to
        self._opening = Opening()
        self._pending = ""  # the latest run's continuation past the opening, not yet agreed on
        self._task: asyncio.Task[None] | None = None
        self._sending = False  # a delta is being sent: the run ends by itself, and is waited for

    def begin(self, item_id: str, start: int) -> None:
        """Speech started: the turn's item ``item_id`` begins at buffer sample ``start``."""
        self.discard()
        self.item_id, self._start, self._heard_at = item_id, start, start

    def heard(self, buffer: InputBuffer) -> None:
        """The buffer grew: starts a run when the turn has grown by a step and nothing stops it."""
        if not self.item_id or (self._task is not None and not self._task.done()):
            return
        end = buffer.samples + buffer.dropped
        heard_s = (end - self._start) / buffer.rate
        if (end - self._heard_at) / buffer.rate < max(MIN_STEP_S, STEP_SHARE * heard_s) or self._busy():
            return
        engine, admission = writer_of(self.session)
        ticket = self._ticket(admission)
        if ticket is None:
            return
        self._heard_at = end
        self._task = asyncio.create_task(self._run(engine, buffer, end))
        # Released however the task ends, even cancelled before it ever ran (its body's finally never would).
        self._task.add_done_callback(lambda _: ticket.release())

    async def finish(self, item_id: str) -> Opening:
        """The turn ``item_id`` is committed: the transcript sent of it so far, for its final run to continue (an
        empty one for another item); a run in flight is stopped, or waited for while it sends."""
        opening = self._opening if item_id == self.item_id else Opening()
        task, self._task = self._task, None
        if task is not None and not task.done():
            if not self._sending:
                task.cancel()
            await asyncio.wait([task])  # its end, however it ends (a cancelled caller is cancelled still)
            opening = self._opening if item_id == self.item_id else Opening()
        self.discard()
        return opening

    def discard(self) -> None:
        """The turn is gone (buffer cleared, VAD reset) or done: nothing more is written down of it."""
        task, self._task = self._task, None
        if task is not None and not task.done() and not self._sending:
            task.cancel()
        self.item_id, self._opening, self._pending = "", Opening(), ""

    def _busy(self) -> bool:
        response = self.session.response
        return response is not None and not response.done()

    @staticmethod
    def _ticket(admission: Admission) -> Ticket | None:
        """A place under the admission bound while more than half of it is free (replies keep the rest)."""
        if 2 * (admission.admitted + 1) > admission.max_requests:
            return None
        try:
            return admission.admit(TRANSCRIPTION_MODALITIES)
        except Overloaded:
            return None

    async def _run(self, engine: OmniEngine, buffer: InputBuffer, end: int) -> None:
        """One run over the turn's audio up to ``end``: its continuation, then the delta agreed on, if any."""
        item_id, opening = self.item_id, self._opening
        try:
            continuation, language = await self._write_down(engine, buffer, end, opening)
        except asyncio.CancelledError:
            raise
        except Exception:  # noqa: BLE001 - a preview: the commit's run writes the turn down anyway
            logger.debug("a live transcription run failed", exc_info=True)
            return
        if item_id != self.item_id or continuation is None:
            return
        fixed = agreed(self._pending, continuation)  # an opening of the continuation, as written
        self._pending = continuation[len(fixed):]
        delta = fixed if opening.text else fixed.lstrip()
        if not delta:
            return
        self._opening = Opening(opening.text + delta, language)
        self._sending = True
        try:
            await self.session.send(server_event("conversation.item.input_audio_transcription.delta",
                                                 item_id=item_id, content_index=0, delta=delta))
        finally:
            self._sending = False

    async def _write_down(self, engine: OmniEngine, buffer: InputBuffer, end: int,
                          opening: Opening) -> tuple[str | None, str | None]:
        """The transcription model's continuation of ``opening`` for the turn's audio up to ``end``, and the
        language it wrote in; None when it cannot be continued (a recogniser that named no language)."""
        session = self.session
        audio = await buffer.copy_in(session.service.pool, self._start, end)
        ask = ask_for(session, audio, opening)
        prompt = await session.service.pool.run(render_transcription, engine.front_end, ask)
        request = transcription_request(engine, prompt, ask, new_id("transcribe"), param="audio")
        reader = reply_reader(engine.front_end, ask)
        texts: list[str] = []
        done: TranscriptDone | None = None
        async with contextlib.aclosing(transcript_events(engine, request,
                                                         timeout_s=session.limits.request_timeout,
                                                         reader=reader)) as events:
            async for event in events:
                if isinstance(event, TranscriptDelta):
                    texts.append(event.text)
                else:
                    done = event
        if done is None or done.failure is not None:
            return None, None
        language = ask.language or reader.language
        if engine.front_end.transcriber is not None and language is None:
            return None, None
        return "".join(texts), language
