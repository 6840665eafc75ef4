"""One benchmark voice session of ``omnistage bench realtime``: a client speaking turns over ``WS /v1/realtime``.

The client behaves as a microphone does: PCM16 appends at real-time pace (20 ms packets, as WebRTC's; ``--packet-ms``),
speech then silence, for ever, while server VAD decides where turns end and
starts each response. A turn's *end of speech* is when its last speech packet
was sent; the reply's first ``response.output_audio.delta`` and first text delta
are timed from it, and also from the ``speech_stopped`` event (the server's VAD
silence wait excluded). A reply is listened to for ``reply_audio_s`` seconds of
audio, then cancelled (``response.cancel``), as a user who heard enough: a
random checkpoint's talker rarely says its end-of-speech code, and its minutes
of audio would both stretch the run and load the other sessions' turns. The
barge-in turn speaks again once the reply's audio has started: its stop time
runs from the new speech's onset (the packet that carried it) to the
interrupted reply's last audio delta.

With sentences (``--turn-detection``: ``realtime_sentences.py``) each turn is one
sentence, some with pauses inside them, under the plan's turn detection. A
``speech_stopped`` that comes while the sentence is still being spoken is a *false
start* (the server ended the turn mid-sentence); the reply it starts is kept apart
from the turn's, and one whose audio began before it was cancelled is a *cut-off*
(the agent talked over the user). The turn's own reply is the one created after its
last packet.
"""

from __future__ import annotations

import asyncio
import base64
import json
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from omnistage.tools.bench.metrics import StreamRecord
from omnistage.tools.bench.realtime_sentences import Sentence
from omnistage.tools.bench.realtime_speech import APPEND_S, RATE, appends, silence_packet, utterance

# The interrupted reply's cap: long enough to be still running when the new speech starts, short enough that its
# transcript (which a random checkpoint's tokens re-tokenize into many more) stays within the context.
BARGE_REPLY_TOKENS = 120
REPLY_TIMEOUT_S = 300.0  # a reply that never finishes fails the turn instead of hanging the run
TURN_END_STEP_S = 4.3  # where a session's next turn ends in the paragraph, past its last one's end


@dataclass
class TurnRecord:
    """One user turn and the reply it drew (times are ``time.perf_counter()`` seconds)."""

    utterance_s: float
    eos: float = 0.0  # when the last speech packet went out
    stopped: float | None = None  # when input_audio_buffer.speech_stopped arrived (the VAD's silence wait over)
    first_audio: float | None = None
    first_text: float | None = None
    audio: list[tuple[float, int]] = field(default_factory=list)  # (arrival, samples) per audio delta
    done: float | None = None
    status: str = ""
    input_tokens: int | None = None  # the reply's usage (None: none came, e.g. a reply the client cancelled)
    cached_tokens: int = 0
    error: str | None = None
    cut: bool = False  # the client cancelled the reply once it had heard enough of it (reply_audio_s)
    pauses: int = 0  # pauses inside the sentence spoken (sentences only)
    false_starts: int = 0  # speech_stopped events that came while the sentence was being spoken

    @property
    def ok(self) -> bool:
        # "incomplete": the reply reached max_output_tokens, as the benchmark bounds every reply.
        done = self.status in ("completed", "incomplete") or (self.cut and self.status == "cancelled")
        return self.error is None and done and self.first_audio is not None

    @property
    def audio_samples(self) -> int:
        return sum(n for _, n in self.audio)

    @property
    def prefill_tokens(self) -> int | None:
        """Prompt tokens the thinker computed for this reply (the rest came from its prefix cache); None without
        usage (a cancelled reply's ``response.done`` has none)."""
        return None if self.input_tokens is None else self.input_tokens - self.cached_tokens

    def stream(self) -> StreamRecord:
        record = StreamRecord(self.eos, end=self.done)
        record.audio = list(self.audio)
        return record


@dataclass
class BargeIn:
    onset: float  # when the packet carrying the new speech's first sound went out
    last_audio: float | None = None  # the interrupted reply's last audio delta
    done: float | None = None  # its response.done (cancelled: the server heard the speech and stopped it)
    status: str = ""

    @property
    def stop_ms(self) -> float | None:
        """New speech start → the interrupted reply's last audio (0 when none came after the speech began)."""
        if self.last_audio is None:
            return None
        return max(0.0, self.last_audio - self.onset) * 1000.0

    @property
    def cancel_ms(self) -> float | None:
        """New speech start → the interrupted reply's ``response.done``: VAD detection plus the cancel."""
        return None if self.done is None or self.status != "cancelled" else (self.done - self.onset) * 1000.0


class TurnAlignment:
    """Every session's turns start at once (``--start together``), not only their first: each turn
    waits, its microphone sending silence, until every session still running has come to it. Without it, a slow
    reply shifts its session's later turns, and how long the sessions stay aligned is chance."""

    def __init__(self, sessions: int) -> None:
        self._sessions = sessions
        self._arrived: set[int] = set()
        self._release = asyncio.Event()

    def arrive(self, session: int) -> asyncio.Event:
        """Session ``session`` is ready for its next turn; the event is set once every running session is."""
        release = self._release
        self._arrived.add(session)
        self._release_if_all()
        return release

    def leave(self, session: int) -> None:
        """The session ended (or failed): the others' turns no longer wait for it."""
        self._sessions -= 1
        self._arrived.discard(session)
        self._release_if_all()

    def _release_if_all(self) -> None:
        if self._arrived and len(self._arrived) >= self._sessions:
            self._release.set()
            self._release, self._arrived = asyncio.Event(), set()


@dataclass(frozen=True)
class SessionPlan:
    url: str  # ws://host:port/v1/realtime?model=...
    utterance_s: float
    turns: int
    streaming_input: bool | None  # None: the server's default (no per-session option sent)
    reply_tokens: int
    barge_in: bool
    speech: np.ndarray  # the paragraph utterances are cut from (24 kHz float32)
    end_s: float  # where this session's first turn ends in it (sessions say different things; a level's on and
    # off modes and its utterance lengths end theirs alike, so each waits the same VAD silence)
    reply_audio_s: float = 0.0  # audio heard of each reply before the client cancels it (0: all of it)
    start_s: float = 0.0  # microphone silence before the first turn (sessions staggered over a turn's cycle)
    alignment: TurnAlignment | None = None  # shared by the level's sessions: each turn starts with every other's
    turn_detection: str = "server_vad"  # or "semantic_vad"
    eagerness: str = "auto"  # semantic_vad's
    sentences: tuple[Sentence, ...] = ()  # each turn one of these, from first_sentence on (none: the paragraph)
    first_sentence: int = 0
    packet_s: float = APPEND_S  # the microphone's packet


class BenchSession:
    def __init__(self, plan: SessionPlan) -> None:
        self.plan = plan
        self.turns: list[TurnRecord] = []
        self.barge: BargeIn | None = None
        self._by_response: dict[str, TurnRecord] = {}
        self._pending: TurnRecord | None = None  # the turn whose response has not been created yet
        self._finished: asyncio.Event = asyncio.Event()
        self._ws: Any = None
        self._barged: TurnRecord | None = None  # the reply the barge-in interrupts
        self._clock = 0.0  # when the next microphone packet is due
        self._speaking: TurnRecord | None = None  # the turn whose sentence is being spoken
        self.false_replies: list[TurnRecord] = []  # replies begun mid-sentence (kept out of the turns' figures)

    async def run(self) -> None:
        import websockets

        async with websockets.connect(self.plan.url, max_size=None) as ws:
            self._ws = ws
            await ws.send(json.dumps({"type": "session.update", "session": self._session()}))
            reader = asyncio.create_task(self._read())
            try:
                self._clock = time.perf_counter()
                if self.plan.start_s > 0:
                    await self._silence_for(self.plan.start_s)
                for i in range(self.plan.turns):
                    await self._turn(i)
                if self.plan.barge_in:
                    await self._barge_in()
            finally:
                reader.cancel()
                if self.plan.alignment is not None:
                    self.plan.alignment.leave(id(self))

    def _session(self) -> dict[str, Any]:
        session: dict[str, Any] = {
            "type": "realtime", "output_modalities": ["audio"], "max_output_tokens": self.plan.reply_tokens,
            "audio": {"input": {"format": {"type": "audio/pcm", "rate": 24000},
                                "turn_detection": self._turn_detection()}}}
        if self.plan.streaming_input is not None:
            session["streaming_input"] = self.plan.streaming_input
        return session

    def _turn_detection(self) -> dict[str, Any]:
        if self.plan.turn_detection == "semantic_vad":
            return {"type": "semantic_vad", "eagerness": self.plan.eagerness}
        return {"type": "server_vad"}

    async def _send_packet(self, pcm: bytes) -> float:
        """Sends one packet when a microphone would (at the end of the audio it recorded)."""
        self._clock += len(pcm) / 2 / 24000
        delay = self._clock - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        else:
            self._clock = time.perf_counter()  # the client fell behind: real time restarts here
        await self._ws.send(json.dumps({"type": "input_audio_buffer.append",
                                        "audio": base64.b64encode(pcm).decode()}))
        return time.perf_counter()

    async def _speak(self, seconds: float, end_s: float) -> list[float]:
        sent = []
        for pcm in appends(utterance(self.plan.speech, seconds, end_s), self.plan.packet_s):
            sent.append(await self._send_packet(pcm))
        return sent

    async def _silence_until(self, done: asyncio.Event, timeout_s: float) -> bool:
        deadline = time.perf_counter() + timeout_s
        while not done.is_set():
            if time.perf_counter() > deadline:
                return False
            await self._send_packet(silence_packet(self.plan.packet_s))
        return True

    async def _turn(self, index: int) -> None:
        turn = TurnRecord(self.plan.utterance_s)
        self.turns.append(turn)
        await self._say(turn, index)
        if not await self._silence_until(self._finished, REPLY_TIMEOUT_S):
            turn.error = turn.error or "no response.done"

    async def _say(self, turn: TurnRecord, index: int) -> None:
        """Turn ``index``'s speech, after a breath (and, aligned, once every session is ready): the reply it draws
        is ``turn``'s."""
        await self._align()
        await self._silence_for(0.5)  # a breath between turns
        self._pending, self._finished = turn, asyncio.Event()
        if not self.plan.sentences:
            turn.eos = (await self._speak(turn.utterance_s, self.plan.end_s + index * TURN_END_STEP_S))[-1]
            return
        sentence = self.plan.sentences[(self.plan.first_sentence + index) % len(self.plan.sentences)]
        turn.utterance_s, turn.pauses, self._speaking = sentence.seconds, len(sentence.pauses), turn
        try:
            for pcm in appends(sentence.audio, self.plan.packet_s):
                turn.eos = await self._send_packet(pcm)
        finally:
            self._speaking = None

    async def _align(self) -> None:
        """With a turn alignment, sends silence until every session is ready for its next turn. The sessions' packet
        clocks started together and tick in whole packets, so their next turns start within a packet of each other."""
        alignment = self.plan.alignment
        if alignment is not None:
            await self._silence_until(alignment.arrive(id(self)), REPLY_TIMEOUT_S)

    async def _silence_for(self, seconds: float) -> None:
        for _ in range(max(1, round(seconds / self.plan.packet_s))):
            await self._send_packet(silence_packet(self.plan.packet_s))

    async def _barge_in(self) -> None:
        """One more turn, interrupted: new speech starts once the reply's audio is flowing."""
        turn = TurnRecord(self.plan.utterance_s)
        self._barged = turn  # never cut by reply_audio_s: the new speech ends it
        # A long reply, so the new speech lands while it is still being generated.
        await self._ws.send(json.dumps({"type": "session.update",
                                        "session": {"type": "realtime", "max_output_tokens": BARGE_REPLY_TOKENS}}))
        await self._say(turn, self.plan.turns)
        while turn.first_audio is None and not self._finished.is_set():
            await self._send_packet(silence_packet(self.plan.packet_s))
            if time.perf_counter() - turn.eos > REPLY_TIMEOUT_S:
                return
        if self._finished.is_set():
            return  # the reply ended before it could be interrupted
        self._finished = asyncio.Event()
        packets = appends(utterance(self.plan.speech, 1.5, self.plan.end_s + 3.0), self.plan.packet_s)
        self.barge = BargeIn(await self._send_packet(packets[0]))
        for pcm in packets[1:]:
            await self._send_packet(pcm)
        await self._silence_until(self._finished, REPLY_TIMEOUT_S)

    async def _read(self) -> None:
        async for raw in self._ws:
            cut = self._on_event(json.loads(raw), time.perf_counter())
            if cut:
                await self._ws.send(json.dumps({"type": "response.cancel"}))

    def _heard_enough(self, turn: TurnRecord) -> bool:
        """True once: the reply has given ``reply_audio_s`` of audio (the barge-in's reply is left to it)."""
        limit = self.plan.reply_audio_s
        if limit <= 0 or turn.cut or turn is self._barged:
            return False
        turn.cut = turn.audio_samples >= limit * RATE
        return turn.cut

    def _on_event(self, event: dict[str, Any], now: float) -> bool:
        """Records one server event; True when the reply it belongs to should now be cancelled."""
        kind = event.get("type", "")
        if kind == "input_audio_buffer.speech_stopped" and self._speaking is not None:
            self._speaking.false_starts += 1
        elif kind == "input_audio_buffer.speech_stopped" and self._pending is not None:
            self._pending.stopped = self._pending.stopped or now
        if kind == "response.created" and self._speaking is not None:
            self.false_replies.append(TurnRecord(0.0))
            self._by_response[event["response"]["id"]] = self.false_replies[-1]
            return False
        if kind == "response.created" and self._pending is not None:
            self._by_response[event["response"]["id"]] = self._pending
            self._pending = None
            return False
        turn = self._by_response.get(event.get("response_id") or event.get("response", {}).get("id", ""))
        if kind == "error" and event.get("error", {}).get("code") == "response_cancel_not_active":
            return False  # our cancel crossed the reply's own end: nothing failed
        if kind == "error":
            # A response refused before it was created belongs to the turn waiting for one; errors of the
            # barge-in speech's own reply (after the measured turns) belong to none.
            target = turn or self._pending
            if target is not None and target.error is None:
                target.error = event.get("error", {}).get("message", "error")
            if turn is None and target is not None:
                self._finished.set()  # no response will come for this turn: the session goes on
        if turn is None:
            return False
        if kind == "response.output_audio.delta":
            turn.first_audio = turn.first_audio or now
            turn.audio.append((now, len(base64.b64decode(event["delta"])) // 2))
            return self._heard_enough(turn)
        if kind in ("response.output_audio_transcript.delta", "response.output_text.delta"):
            turn.first_text = turn.first_text or now
        elif kind == "response.done":
            self._response_done(turn, event["response"], now)
        return False

    def _response_done(self, turn: TurnRecord, response: dict[str, Any], now: float) -> None:
        turn.done, turn.status = now, response.get("status", "")
        usage = response.get("usage") or {}
        turn.input_tokens = int(usage["input_tokens"]) if "input_tokens" in usage else None
        turn.cached_tokens = int((usage.get("input_token_details") or {}).get("cached_tokens", 0))
        if self.barge is not None and turn is self._barged:
            self.barge.status, self.barge.done = turn.status, now
            self.barge.last_audio = turn.audio[-1][0] if turn.audio else None
        if turn.status == "failed" and turn.error is None:
            turn.error = str((response.get("status_details") or {}).get("error", "failed"))
        if all(turn is not false for false in self.false_replies):
            self._finished.set()
