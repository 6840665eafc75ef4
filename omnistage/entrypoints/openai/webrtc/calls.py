"""The server's live WebRTC calls: each one a peer connection running one realtime session.

A call answers the browser's SDP offer (aiortc gathers every candidate
before the answer is written, so the answer is complete: no trickle ICE),
then runs the session until it ends: hang-up (``DELETE
/v1/realtime/calls/{id}``), the peer closing or its ICE failing, the call not
connecting within ``--webrtc-connect-timeout``, or the session's idle
timeout. However it ends, the session's running response is aborted in every
stage (the session loop's own clean-up) and the peer connection is closed.

A call's session takes its place among the server's realtime sessions
(``--max-realtime-sessions``) before the answer: past it the offer is a 429.
The number of calls is bounded (``--webrtc-max-calls``), those being set up
counted too: a place is taken before the first await of the set-up and given
back if it fails, so offers sent at once cannot all pass the check before any
of them is counted. Set-ups then run a few at a time: each is ~5-10 ms of
aiortc's work on the event loop in small slices, and 64 of them interleaved
made every turn of the loop run 64 slices (a /health behind them waited
~0.1-0.2 s); queued, they leave it room between two slices.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from aiortc import RTCConfiguration, RTCIceServer, RTCPeerConnection, RTCSessionDescription

from omnistage.entrypoints.openai.realtime.event_error import EventError
from omnistage.entrypoints.openai.realtime.protocol import new_id
from omnistage.entrypoints.openai.realtime.session_loop import RealtimeService, RealtimeSession
from omnistage.entrypoints.openai.server_config import WebRtcPolicy
from omnistage.entrypoints.openai.webrtc.transport import WebRtcTransport

logger = logging.getLogger(__name__)
SETUPS_AT_ONCE = 4


class TooManyCalls(RuntimeError):
    pass


class CallSession(Protocol):
    def take_place(self) -> None:
        """Takes the session's place among those the server holds; EventError when it holds all it may."""

    async def run(self) -> None:
        """The session until it ends (its own clean-up included)."""


# What a call runs: given its peer connection and id, the transport and the session over it (a realtime session,
# or a GPT-Live one: ``live/route.py``).
SessionFactory = Callable[[RTCPeerConnection, str], tuple[WebRtcTransport, CallSession]]


@dataclass
class Call:
    id: str
    pc: RTCPeerConnection
    transport: WebRtcTransport
    session: CallSession
    owner: bytes | None = None  # the digest of the ephemeral key that opened it (that key may hang it up)
    task: asyncio.Task[None] | None = None

    def opened_by(self, owner: bytes) -> bool:
        return self.owner is not None and hmac.compare_digest(self.owner, owner)

    async def hang_up(self) -> None:
        await self.transport.close("hang-up")
        if self.task is not None:
            await asyncio.gather(self.task, return_exceptions=True)


@dataclass
class Calls:
    service: RealtimeService
    ice_servers: tuple[RTCIceServer, ...] = ()  # none: host candidates only (loopback, one LAN)
    policy: WebRtcPolicy = field(default_factory=WebRtcPolicy)
    live: dict[str, Call] = field(default_factory=dict)
    setting_up: int = 0  # calls between their place taken and their answer
    _setups: asyncio.Semaphore = field(default_factory=lambda: asyncio.Semaphore(SETUPS_AT_ONCE))

    def check_room(self) -> None:
        """TooManyCalls when no call may start now (those being set up count)."""
        if len(self.live) + self.setting_up >= self.policy.max_calls:
            raise TooManyCalls(f"{self.policy.max_calls} calls are in progress (--webrtc-max-calls)")

    async def start(self, offer_sdp: str, settings: dict[str, Any] | None,
                    owner: bytes | None = None, session: SessionFactory | None = None) -> tuple[Call, str]:
        """A new call answering ``offer_sdp`` (screened: ``offer_screen.py``): the call and the SDP answer.
        ``session``: what the call runs (None: a realtime session with ``settings``).
        ValueError (or another of aiortc's errors) for an offer aiortc cannot take; TooManyCalls past the bound."""
        self.check_room()
        self.setting_up += 1  # taken with the check, before any await
        try:
            async with self._setups:
                call, answer = await self._answer(offer_sdp, session or self._realtime(settings), owner)
        finally:
            self.setting_up -= 1
        await self._take_place(call)
        self.live[call.id] = call
        call.task = asyncio.create_task(self._run(call))
        return call, answer

    async def _take_place(self, call: Call) -> None:
        """The session's place is taken before the call is answered, so that a server holding all the sessions it
        may refuses the offer (429): answered, the call would end before its data channel opened, its client never
        hearing why (the soak's "no session.created" while a probe held every realtime session, issue 50)."""
        try:
            call.session.take_place()
        except EventError:
            await call.transport.close("too many sessions")
            raise TooManyCalls(f"{self.service.budget.max_sessions} realtime sessions are open "
                               "(--max-realtime-sessions)") from None

    def _realtime(self, settings: dict[str, Any] | None) -> SessionFactory:
        def make(pc: RTCPeerConnection, _: str) -> tuple[WebRtcTransport, CallSession]:
            transport = WebRtcTransport(pc, lambda: session.config)
            # A speech recogniser's calls are transcription sessions: transcripts on the data channel, no reply.
            kind = "transcription" if self.service.engine.front_end.processor is None else "realtime"
            session = RealtimeSession(transport, self.service, kind=kind, settings=settings)
            return transport, session
        return make

    async def _answer(self, offer_sdp: str, make: SessionFactory, owner: bytes | None) -> tuple[Call, str]:
        # An explicit list, even empty: aiortc's default (None) would ask Google's STUN server.
        pc = RTCPeerConnection(RTCConfiguration(iceServers=list(self.ice_servers)))
        try:
            call_id = new_id("rtc")
            transport, session = make(pc, call_id)
            call = Call(call_id, pc, transport, session, owner)
            await pc.setRemoteDescription(RTCSessionDescription(offer_sdp, "offer"))
            if not any(t.kind == "audio" for t in pc.getTransceivers()):
                raise ValueError("the offer has no audio media section")
            pc.addTrack(transport.reply)
            await pc.setLocalDescription(await pc.createAnswer())
        except BaseException:  # cancelled too (the client left): the sockets must not outlive the request
            with contextlib.suppress(Exception):  # aiortc cannot close every half-read offer; nothing is open then
                await pc.close()
            raise
        return call, pc.localDescription.sdp

    async def _run(self, call: Call) -> None:
        watchdog = asyncio.create_task(self._end_unless_connected(call))
        try:
            await call.session.run()
        except Exception:  # noqa: BLE001 - one call's failure must not reach the server
            logger.exception("webrtc call %s failed", call.id)
        finally:
            watchdog.cancel()
            self.live.pop(call.id, None)
            await call.transport.close("session ended")

    async def _end_unless_connected(self, call: Call) -> None:
        """A call whose ICE never completes would hold its place until the session's idle timeout (minutes)."""
        try:
            async with asyncio.timeout(self.policy.connect_timeout):
                await call.transport.connected.wait()
        except TimeoutError:
            logger.info("webrtc call %s did not connect within %g s (--webrtc-connect-timeout); ending it",
                        call.id, self.policy.connect_timeout)
            await call.transport.close("did not connect")

    async def close_all(self) -> None:
        await asyncio.gather(*(call.hang_up() for call in list(self.live.values())), return_exceptions=True)
