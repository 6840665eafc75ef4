"""The server's live WebRTC calls: each one a peer connection running one realtime session.

A call answers the browser's SDP offer (aiortc gathers every candidate
before the answer is written, so the answer is complete: no trickle ICE),
then runs the session until it ends: hang-up (``DELETE
/v1/realtime/calls/{id}``), the peer closing or its ICE failing, or the
session's idle timeout. However it ends, the session's running response
is aborted in every stage (the session loop's own clean-up) and the peer
connection is closed. The number of calls is bounded.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import Any

from aiortc import RTCConfiguration, RTCIceServer, RTCPeerConnection, RTCSessionDescription

from omnistage.entrypoints.openai.realtime.protocol import new_id
from omnistage.entrypoints.openai.realtime.session_loop import RealtimeService, RealtimeSession
from omnistage.entrypoints.openai.webrtc.transport import WebRtcTransport

logger = logging.getLogger(__name__)
DEFAULT_MAX_CALLS = 64


class TooManyCalls(RuntimeError):
    pass


@dataclass
class Call:
    id: str
    pc: RTCPeerConnection
    transport: WebRtcTransport
    session: RealtimeSession
    task: asyncio.Task[None] | None = None

    async def hang_up(self) -> None:
        await self.transport.close("hang-up")
        if self.task is not None:
            await asyncio.gather(self.task, return_exceptions=True)


@dataclass
class Calls:
    service: RealtimeService
    ice_servers: tuple[RTCIceServer, ...] = ()  # none: host candidates only (loopback, one LAN)
    max_calls: int = DEFAULT_MAX_CALLS
    live: dict[str, Call] = field(default_factory=dict)

    async def start(self, offer_sdp: str, settings: dict[str, Any] | None) -> tuple[Call, str]:
        """A new call answering ``offer_sdp``: the call and the SDP answer. ValueError for an offer aiortc
        cannot take; TooManyCalls past ``max_calls``."""
        if len(self.live) >= self.max_calls:
            raise TooManyCalls(f"{self.max_calls} calls are in progress")
        # An explicit list, even empty: aiortc's default (None) would ask Google's STUN server.
        pc = RTCPeerConnection(RTCConfiguration(iceServers=list(self.ice_servers)))
        call: Call | None = None
        try:
            transport = WebRtcTransport(pc, lambda: session.config)
            session = RealtimeSession(transport, self.service, settings=settings)
            call = Call(new_id("rtc"), pc, transport, session)
            await pc.setRemoteDescription(RTCSessionDescription(offer_sdp, "offer"))
            if not any(t.kind == "audio" for t in pc.getTransceivers()):
                raise ValueError("the offer has no audio media section")
            pc.addTrack(transport.reply)
            await pc.setLocalDescription(await pc.createAnswer())
        except Exception:
            await pc.close()
            raise
        self.live[call.id] = call
        call.task = asyncio.create_task(self._run(call))
        return call, pc.localDescription.sdp

    async def _run(self, call: Call) -> None:
        try:
            await call.session.run()
        except Exception:  # noqa: BLE001 - one call's failure must not reach the server
            logger.exception("webrtc call %s failed", call.id)
        finally:
            self.live.pop(call.id, None)
            await call.transport.close("session ended")

    async def hang_up(self, call_id: str) -> bool:
        call = self.live.get(call_id)
        if call is None:
            return False
        await call.hang_up()
        return True

    async def close_all(self) -> None:
        await asyncio.gather(*(call.hang_up() for call in list(self.live.values())), return_exceptions=True)
