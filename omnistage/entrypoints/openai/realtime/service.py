"""What every realtime session shares: the engine, the server's limits, admission and pools, the VAD, the
server-wide budget of sessions and what they hold (``budget.py``), and the serve-wide defaults of streaming
input and speculative replies."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Protocol

from omnistage.audio.vad_backend import VadBackend
from omnistage.entrypoints.openai.common.admission import Admission
from omnistage.entrypoints.openai.common.decode_pool import DecodePool
from omnistage.entrypoints.openai.common.recogniser import ServedRecogniser
from omnistage.entrypoints.openai.common.served_model import ServedModel
from omnistage.entrypoints.openai.engine_protocol import OmniEngine
from omnistage.entrypoints.openai.realtime.budget import RealtimeBudget
from omnistage.entrypoints.openai.realtime.speculation import CountOutcome, ignore_outcome
from omnistage.entrypoints.openai.realtime.speculation_gate import SpeculationGate
from omnistage.entrypoints.openai.server_config import ServerLimits

VAD_WORKERS = 2  # threads running every session's audio work (model-based VAD, large appends' decoding)


class OpenSession(Protocol):
    """A session the drain reaches (a realtime session, a duplex Live session): told the server stops, it ends."""

    async def shut_down(self) -> None: ...


@dataclass
class RealtimeService:
    engine: OmniEngine
    limits: ServerLimits
    admission: Admission
    pool: DecodePool
    served: ServedModel
    vad: VadBackend  # the server_vad detector (--vad)
    vad_pool: DecodePool  # where a model-based detector runs and large appends are decoded, off the event loop
    streaming_input: bool = True  # sessions prefill their user's turn while it is spoken (realtime/listening.py)
    speculative_reply_ms: int = 0  # a turn's pause that starts its reply early (realtime/speculation.py; 0: never)
    count_speculation: CountOutcome = ignore_outcome  # told "used" or "dropped" as each speculative reply ends
    first_chunk_frames: int | None = None  # codec frames in a reply's first code2wav chunk (None: the stage's)
    recogniser: ServedRecogniser | None = None  # serve --transcription-model: what sessions may write turns down with
    # Whether a pause may start a speculative reply now: the server's headroom, and a cap (speculation_gate.py).
    speculation_gate: SpeculationGate = field(default_factory=SpeculationGate)
    budget: RealtimeBudget = field(init=False)  # what all sessions together may hold (realtime/budget.py)
    sessions: set[OpenSession] = field(init=False, default_factory=set)  # open now, WebSocket and WebRTC

    def __post_init__(self) -> None:
        self.budget = RealtimeBudget(self.limits)

    async def shut_down_sessions(self) -> None:
        """The server stops (``common/draining.py``): each open session finishes its running response, is told
        why, and ends."""
        await asyncio.gather(*(session.shut_down() for session in list(self.sessions)), return_exceptions=True)
