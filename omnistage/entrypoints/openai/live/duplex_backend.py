"""A GPT-Live session on the duplex engine: one :class:`~omnistage.engine.duplex.session.DuplexSession`.

The client's audio (base64 in the session's format, or a WebRTC track's samples) is decoded, resampled as a
stream to the codec's rate and cut into its frames (``AudioFramer``); each frame goes to the session's jitter
buffer, and a client ahead of real time waits for room there (backpressure on its reads) rather than losing
frames. The engine's tick thread hands each agent frame to the event loop (one ``call_soon_threadsafe`` per
frame); there it becomes an output audio delta in the session's format and, where its inner-monologue token is
text (not the family's padding), a transcript delta, detokenised incrementally. The session's instructions
become the family's prompt where it takes one (``DuplexServed.prompt``: PersonaPlex's text prompt), else they
are left unused. ``close`` ends the engine's session (its model row and codec stream freed at the next tick);
a server that stops ends it with ``server_shutting_down``.

Hops: engine thread → loop (one per frame), then the Live session's pump; no copy of the audio but its encoding.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
from collections.abc import AsyncIterator

import numpy as np
import torch

from omnistage.audio.resample_stream import StreamResampler
from omnistage.engine.duplex.engine import SessionRefused
from omnistage.engine.duplex.session import AgentFrame, AudioFramer, DuplexSession
from omnistage.entrypoints.openai.live.backend import AudioOut, Ended, LiveOutput, TranscriptOut, until_ended
from omnistage.entrypoints.openai.live.events import ContextKind, StartConfig
from omnistage.entrypoints.openai.realtime.audio_formats import InputFormat, OutputEncoder, OutputFormat
from omnistage.entrypoints.openai.realtime.event_error import EventError
from omnistage.entrypoints.openai.realtime.service import RealtimeService
from omnistage.entrypoints.openai.realtime.transport import ClientAudio
from omnistage.pipeline.detokenizer import IncrementalDetokenizer
from omnistage.pipeline.duplex_omni import DuplexOmni

CAPACITY_CODE = "session_capacity_exceeded"
ENGINE_STOPPED = EventError("engine_stopped", "the duplex engine has stopped (see the server's log and /health); "
                            "reconnect once it is healthy", error_type="server_error")
SHUTTING_DOWN = EventError("server_shutting_down", "the server is shutting down; reconnect to go on",
                           error_type="server_error")


class DuplexBackend:
    def __init__(self, service: RealtimeService, engine: DuplexOmni) -> None:
        codec = engine.sessions.codec
        if codec is None:
            raise ValueError(f"{engine.model_name}: a live session hears audio, and this duplex model has no codec")
        self.service, self.engine = service, engine
        self.rate = _rate(engine)
        self._out: asyncio.Queue[LiveOutput] = asyncio.Queue()
        self._session: DuplexSession | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._framer = AudioFramer(codec.samples_per_frame)
        self._input: InputFormat = InputFormat()
        self._resamplers: dict[int, StreamResampler] = {}
        self._encoder: OutputEncoder | None = None
        self._text = IncrementalDetokenizer(engine.front_end.tokenizer)  # type: ignore[arg-type]
        self._ended = False

    # -- the backend's interface -----------------------------------------------------------------
    async def start(self, config: StartConfig) -> list[EventError]:
        self._loop = asyncio.get_running_loop()
        self._input = InputFormat(config.audio.kind, config.audio.rate)
        # PCM goes out at 24 kHz (the Live speaker resamples a 16 kHz session's); G.711 in its own format
        self._encoder = OutputFormat(config.audio.kind).encoder(self.rate)
        make_prompt = self.engine.served.prompt
        prompt = make_prompt(config.instructions, config.voice) if make_prompt is not None else None
        try:
            self._session = self.engine.sessions.open(self._on_frame, prompt)
        except SessionRefused as exc:
            return [EventError(CAPACITY_CODE, f"{exc}; try again later", "session", error_type="server_error")]
        self.service.sessions.add(self)  # the drain tells it the server stops
        return []

    async def hear(self, audio: str | ClientAudio, event_id: str | None = None) -> None:
        session = self._session
        if session is None or self._ended:
            return
        samples, rate = self._decode(audio, event_id)
        for frame in self._framer.frames(torch.from_numpy(self._resampled(samples, rate))):
            while session.room <= 0 and not self._ended:  # ahead of real time: wait for the engine's tick
                if not self.engine.sessions.running:  # no tick will come: the session ends, said why
                    self._ended = True
                    self._out.put_nowait(Ended("connection_lost", ENGINE_STOPPED))
                    return
                await asyncio.sleep(self.engine.sessions.model.frame_s / 2)
            session.hear(frame)

    async def append(self, kind: ContextKind, text: str, event_id: str | None) -> None:
        # A duplex model's text context is its prompt, read before its first frame: text appended later would go
        # unheard, so the client is told rather than given an ``appended`` it cannot rely on.
        raise EventError("unsupported_feature", f"session.{kind}.append: {self.engine.model_name} is a full-duplex "
                         "model whose text context is fixed when the session starts (its instructions)", "type",
                         event_id)

    def outputs(self) -> AsyncIterator[LiveOutput]:
        return until_ended(self._out)

    async def close(self) -> None:
        self._ended = True
        self.service.sessions.discard(self)
        if self._session is not None:
            self.engine.sessions.close(self._session)  # its row and codec stream are freed at the next tick

    async def shut_down(self) -> None:
        """The server stops: the client hears why, then the session ends (the Live session closes with 1001)."""
        if not self._ended:
            self._out.put_nowait(Ended("connection_lost", SHUTTING_DOWN))

    # -- the engine's side -----------------------------------------------------------------------
    def _on_frame(self, frame: AgentFrame) -> None:
        """On the engine's tick thread: the frame goes to the event loop."""
        if not self._ended and self._loop is not None:
            self._loop.call_soon_threadsafe(self._emit, frame)

    def _emit(self, frame: AgentFrame) -> None:
        if self._ended or self._encoder is None or frame.audio is None:
            return
        pcm = self._encoder.encode(frame.audio.numpy())
        self._out.put_nowait(AudioOut(base64.b64encode(pcm).decode("ascii")))
        if frame.text >= 0 and frame.text not in self.engine.served.silent_text:
            delta = self._text.add([frame.text]).text
            if delta:
                self._out.put_nowait(TranscriptOut("assistant", delta))

    # -- input audio -----------------------------------------------------------------------------
    def _decode(self, audio: str | ClientAudio, event_id: str | None) -> tuple[np.ndarray, int]:
        if isinstance(audio, ClientAudio):
            return audio.samples, audio.rate
        try:
            raw = base64.b64decode(audio, validate=True)
        except (binascii.Error, ValueError) as exc:
            raise EventError("invalid_audio", "'audio' is not valid base64", "audio", event_id) from exc
        try:
            return self._input.decode(raw), self._input.rate
        except EventError as exc:
            exc.event_id = event_id
            raise

    def _resampled(self, samples: np.ndarray, rate: int) -> np.ndarray:
        if rate == self.rate:
            return samples.astype(np.float32, copy=False)
        resample = self._resamplers.get(rate)
        if resample is None:
            resample = self._resamplers[rate] = StreamResampler(rate, self.rate)
        return resample(samples)


def _rate(engine: DuplexOmni) -> int:
    audio = engine.front_end.audio
    if audio is None:
        raise ValueError(f"{engine.model_name}: a duplex family declares its audio (FrontEnd.audio)")
    return audio.sample_rate
