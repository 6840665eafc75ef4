"""Issue 50's soak traffic beyond chat and speech, for ``soak.py``: transcriptions of real speech, realtime sessions
over the WebSocket (a spoken turn, answered or barged in on with ``response.cancel``) and WebRTC calls (a spoken
turn on the microphone track, the reply heard on the reply track, then hung up). Each records its time to first
audio where it has one, so that the soak can compare the first and the last minutes of the run.

The speech is espeak-ng's (silero, the server's VAD, rightly ignores tones), made once per run.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import fractions
import io
import json
import subprocess
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import numpy as np
import soundfile
from aiortc import RTCConfiguration, RTCPeerConnection, RTCSessionDescription
from aiortc.mediastreams import AudioStreamTrack, MediaStreamError
from av import AudioFrame
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

Record = Callable[[str, float, bool, str], None]
RATE = 24_000  # realtime's pcm16 rate, and the WebRTC track's (resampled by aiortc to its 48 kHz)
SENTENCE = "Hello there. Could you tell me what the weather is like today?"


def spoken(text: str = SENTENCE, rate: int = RATE) -> np.ndarray:
    """espeak-ng's voice for ``text``, mono float32 at ``rate`` (linear resampling: good enough for a VAD)."""
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "speech.wav"
        subprocess.run(["espeak-ng", "-w", str(path), text], check=True, capture_output=True)
        samples, source_rate = soundfile.read(path, dtype="float32")
    if samples.ndim > 1:
        samples = samples.mean(axis=1)
    positions = np.arange(int(len(samples) * rate / source_rate)) * source_rate / rate
    return np.interp(positions, np.arange(len(samples)), samples).astype(np.float32)


def pcm16(samples: np.ndarray) -> bytes:
    return (np.clip(samples, -1, 1) * 32767).astype("<i2").tobytes()


def wav(samples: np.ndarray, rate: int = RATE) -> bytes:
    out = io.BytesIO()
    soundfile.write(out, samples, rate, format="WAV", subtype="PCM_16")
    return out.getvalue()


def carries_audio(line: str) -> bool:
    """An SSE line whose delta holds audio samples (not only the audio's transcript)."""
    at = line.find('"audio":')
    return at >= 0 and '"data":"' in line[at:] and '"data":""' not in line[at:]


# Probes that hold the server's CPU or event loop for seconds (tens of MB parsed or decoded, floods of sessions or
# calls, a stopped stage): the /health canary waited 0.4-1.4 s during each in a 10-minute soak. A reply that met
# one waited on the probe, and the handful that do decide a window's p99 by where the probe cycle happens to fall.
# ``soak_probe_costs.py`` measures each alone: realtime_commits (25 commits of 600 s, 1 GB of base64 decoded and
# listened to) is the heaviest, 20-23 API CPU s over 15-33 s, a core and more for a quarter of each probe cycle.
HEAVY_PROBES = frozenset({"four_60mb_media", "speech_stream_4mb", "voice_5mhz", "realtime_item_audio",
                          "realtime_flood", "realtime_memory", "webrtc_call_flood", "talker_sigstop",
                          "realtime_commits"})


def _windows(began: float, elapsed: float, window_s: float) -> list[tuple[str, Callable[[float], bool]]]:
    """The run's first and last ``window_s`` (a quarter of a shorter run): each name and whether a time is in it."""
    window = min(window_s, elapsed / 4)
    return [("first", lambda t: t - began < window), ("last", lambda t: t - began >= elapsed - window)]


def first_audio_windows(records: list[tuple[float, str, float]], began: float, elapsed: float,
                        window_s: float, probes: list[tuple[str, float, float]] = ()) -> dict[str, object]:
    """Time to first audio (s) in the run's first and last ``window_s`` (a quarter of a shorter run), all kinds
    together and per kind: ``n``, p50 and p99 in ms; ``clear``: the replies that met none of the heavy probes
    (``probes``: their name, start and end)."""
    heavy = [(start, end) for name, start, end in probes if name in HEAVY_PROBES]

    def summary(values: list[float]) -> dict[str, float]:
        ordered = sorted(values)
        return {"n": len(ordered), "p50_ms": round(ordered[len(ordered) // 2] * 1000, 1) if ordered else None,
                "p99_ms": round(ordered[min(int(len(ordered) * 0.99), len(ordered) - 1)] * 1000, 1)
                if ordered else None}

    def clear(t: float, s: float) -> bool:
        return not any(start <= t + s and t <= end for start, end in heavy)

    out: dict[str, object] = {"window_s": round(min(window_s, elapsed / 4))}
    for name, keep in _windows(began, elapsed, window_s):
        chosen = [(kind, t, s) for t, kind, s in records if keep(t)]
        out[name] = {"all": summary([s for _, _, s in chosen]),
                     "clear": summary([s for _, t, s in chosen if clear(t, s)]),
                     **{kind: summary([s for k, _, s in chosen if k == kind]) for kind in sorted({k for k, _, _ in chosen})}}
    return out


def slowest_replies(records: list[tuple[float, str, float]], began: float, elapsed: float, window_s: float,
                    probes: list[tuple[str, float, float]], canary: list[tuple[float, float]],
                    count: int = 8) -> dict[str, list[dict[str, object]]]:
    """The ``count`` slowest first audios in the run's first and last windows, each with what it met: every probe
    whose window overlapped it and the slowest /health canary answer started meanwhile, so a window's p99 can be
    traced to its cause."""
    out: dict[str, list[dict[str, object]]] = {}
    for name, keep in _windows(began, elapsed, window_s):
        chosen = sorted(((s, t, kind) for t, kind, s in records if keep(t)), reverse=True)[:count]
        out[name] = [{"at_s": round(t - began, 1), "kind": kind, "ms": round(s * 1000, 1),
                      "met": sorted({p for p, start, end in probes if start <= t + s and t <= end}),
                      "canary_max_ms": round(1000 * max((lat for at, lat in canary if t <= at <= t + s),
                                                        default=0.0), 1)}
                     for s, t, kind in chosen]
    return out


class CallsGate:
    """Normal WebRTC calls share it; the call-flood probe takes it alone. The probe checks that no more than
    --webrtc-max-calls of its offers were set up, which calls of the normal traffic hung up meanwhile would
    make possible (their slots taken again by the flood)."""

    def __init__(self) -> None:
        self._idle = asyncio.Condition()
        self._calls = 0
        self._exclusive = False

    @contextlib.asynccontextmanager
    async def shared(self) -> AsyncIterator[None]:
        async with self._idle:
            await self._idle.wait_for(lambda: not self._exclusive)
            self._calls += 1
        try:
            yield
        finally:
            async with self._idle:
                self._calls -= 1
                self._idle.notify_all()

    @contextlib.asynccontextmanager
    async def exclusive(self) -> AsyncIterator[None]:
        async with self._idle:
            self._exclusive = True
            await self._idle.wait_for(lambda: self._calls == 0)
        try:
            yield
        finally:
            async with self._idle:
                self._exclusive = False
                self._idle.notify_all()


def server_bound(detail: str) -> bool:
    """A refusal because the server is at one of its configured bounds (a 429, or a realtime error naming the
    flag): what the probes that fill those bounds cause on purpose, and an honest answer, not an error."""
    return (detail.startswith("429") or "--max-realtime-" in detail or "--webrtc-max-calls" in detail
            or "too many sessions" in detail)


@dataclass
class Sessions:
    url: str
    model: str
    api_key: str
    record: Record
    first_audio: list[tuple[float, str, float]] = field(default_factory=list)  # (when, kind, seconds)
    calls: CallsGate = field(default_factory=CallsGate)
    _speech: np.ndarray | None = field(default=None, repr=False)

    @property
    def speech(self) -> np.ndarray:
        if self._speech is None:
            self._speech = spoken()
        return self._speech

    def heard_first_audio(self, kind: str, started: float) -> None:
        self.first_audio.append((started, kind, time.monotonic() - started))

    async def transcription(self, client: httpx.AsyncClient) -> None:
        started = time.monotonic()
        r = await client.post("/v1/audio/transcriptions", data={"model": self.model, "response_format": "json"},
                              files={"file": ("speech.wav", wav(self.speech), "audio/wav")})
        ok = r.status_code == 200 and isinstance(r.json().get("text"), str)
        self.record("transcription", started, ok, f"{r.status_code} {r.text[:200]}")

    # ---- realtime over the WebSocket ------------------------------------------------------------------------

    async def realtime_turn(self, barge_in: bool) -> None:
        """A spoken turn, committed by hand; its reply's first audio is timed; a barge-in cancels the reply
        mid-way (``response.done`` must still come, cancelled or already completed)."""
        kind = "realtime_barge_in" if barge_in else "realtime_turn"
        started = time.monotonic()
        ws_url = self.url.replace("http://", "ws://") + f"/v1/realtime?model={self.model}"
        headers = {"Authorization": f"Bearer {self.api_key}"}
        try:
            async with connect(ws_url, additional_headers=headers, max_size=None) as ws:
                await ws.send(json.dumps({"type": "session.update", "session": {"type": "realtime", "audio": {
                    "input": {"format": {"type": "audio/pcm", "rate": RATE}, "turn_detection": None}}}}))
                await ws.send(json.dumps({"type": "input_audio_buffer.append",
                                          "audio": base64.b64encode(pcm16(self.speech)).decode()}))
                await ws.send(json.dumps({"type": "input_audio_buffer.commit"}))
                asked = time.monotonic()
                await ws.send(json.dumps({"type": "response.create"}))
                status = await self._answer(ws, kind, asked, barge_in)
        except ConnectionClosed as exc:  # refused at --max-realtime-sessions: closed with that reason
            status = f"closed: {exc.rcvd.reason if exc.rcvd else exc}"
        if server_bound(status):
            return self.record(f"{kind}_shed", started, True, status)
        self.record(kind, started, status in ({"cancelled", "completed"} if barge_in else {"completed"}),
                    f"the response ended {status}")

    async def _answer(self, ws: object, kind: str, asked: float, barge_in: bool) -> str:
        """The response's final status ("error: ..." for an error event), timing its first audio."""
        heard = False
        while True:
            event = json.loads(await asyncio.wait_for(ws.recv(), 120))  # type: ignore[attr-defined]
            if event["type"] == "error":
                return f"error: {event['error'].get('message', '')[:200]}"
            if event["type"] == "response.output_audio.delta" and not heard:
                heard = True
                self.heard_first_audio(kind, asked)
                if barge_in:
                    await ws.send(json.dumps({"type": "response.cancel"}))  # type: ignore[attr-defined]
            if event["type"] == "response.done":
                return str(event["response"]["status"])

    # ---- WebRTC --------------------------------------------------------------------------------------------

    async def webrtc_call(self, client: httpx.AsyncClient) -> None:
        """A call as a browser makes one: the offer, the spoken turn on the microphone track, server VAD, the
        reply's first audible frame on the reply track, then a hang-up that must end the call."""
        async with self.calls.shared():
            await self._call(client)

    async def _call(self, client: httpx.AsyncClient) -> None:
        started = time.monotonic()
        pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
        events: list[dict] = []
        channel = pc.createDataChannel("oai-events")
        channel.on("message", lambda message: events.append(json.loads(message)))
        mic = _Microphone()
        pc.addTrack(mic)
        heard: list[float] = []
        listening: list[asyncio.Task] = []

        def on_track(track: object) -> None:  # returns nothing: pyee would schedule a returned awaitable again
            listening.append(asyncio.ensure_future(_listen(track, heard)))

        pc.on("track", on_track)
        try:
            await pc.setLocalDescription(await pc.createOffer())
            r = await client.post("/v1/realtime/calls", content=pc.localDescription.sdp,
                                  headers={"Content-Type": "application/sdp"})
            if r.status_code != 201:
                detail = f"{r.status_code} {r.text[:200]}"
                return self.record("webrtc_call_shed" if server_bound(detail) else "webrtc_call", started,
                                   server_bound(detail), detail)
            location = r.headers["location"]
            await pc.setRemoteDescription(RTCSessionDescription(r.text, "answer"))
            ok, detail = await self._spoken_call(mic, events, heard)
            hung_up = await client.delete(location)
            ok = ok and hung_up.status_code == 200
            self.record("webrtc_call", started, ok, detail or f"hang-up: {hung_up.status_code}")
        finally:
            await pc.close()
            for task in listening:  # ended by the closed track; cancelled should it still wait
                task.cancel()

    async def _spoken_call(self, mic: _Microphone, events: list[dict], heard: list[float]) -> tuple[bool, str]:
        if not await _until(lambda: any(e["type"] == "session.created" for e in events), 20):
            return False, "no session.created"
        mic.push(self.speech)
        if not await _until(lambda: any(e["type"] == "input_audio_buffer.speech_stopped" for e in events), 30):
            return False, "the VAD never heard the end of the speech"
        stopped = time.monotonic()
        if not await _until(lambda: any(t > stopped for t in heard), 60):
            return False, f"no reply heard: {[e['type'] for e in events][-8:]}"
        self.first_audio.append((stopped, "webrtc_call", min(t for t in heard if t > stopped) - stopped))
        done = await _until(lambda: any(e["type"] == "response.done" for e in events), 120)
        return done, "" if done else "no response.done"


async def _until(predicate: Callable[[], bool], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.02)
    return True


async def _listen(track: object, heard: list[float]) -> None:
    """Arrival times of the reply track's audible frames (its silence between replies is not heard)."""
    while True:
        try:
            frame = await track.recv()  # type: ignore[attr-defined]
        except MediaStreamError:
            return
        pcm = frame.to_ndarray().astype(np.float32) / 32768.0
        if float(np.sqrt(np.mean(pcm ** 2))) > 0.003:
            heard.append(time.monotonic())


class _Microphone(AudioStreamTrack):
    """20 ms frames at real time: what was pushed, then silence (a browser's microphone in a quiet room)."""

    kind = "audio"
    FRAME = RATE // 50

    def __init__(self) -> None:
        super().__init__()
        self._queued = np.zeros(0, np.float32)
        self._sent = 0
        self._start: float | None = None

    def push(self, samples: np.ndarray) -> None:
        self._queued = np.concatenate([self._queued, samples, np.zeros(RATE, np.float32)])  # a second's pause

    async def recv(self) -> AudioFrame:
        if self._start is None:
            self._start = time.monotonic()
        wait = self._start + self._sent / RATE - time.monotonic()
        if wait > 0:
            await asyncio.sleep(wait)
        chunk, self._queued = self._queued[:self.FRAME], self._queued[self.FRAME:]
        chunk = np.pad(chunk, (0, self.FRAME - len(chunk)))
        row = (np.clip(chunk, -1, 1) * 32767).astype(np.int16)[None, :]
        frame = AudioFrame.from_ndarray(row, format="s16", layout="mono")
        frame.sample_rate, frame.pts, frame.time_base = RATE, self._sent, fractions.Fraction(1, RATE)
        self._sent += self.FRAME
        return frame

