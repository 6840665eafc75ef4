"""The speculation gate (``realtime/speculation_gate.py``): speculative replies start only with headroom.

Fake players stand for committed replies (their audio ahead of the player set by the test), a fake clock for time;
the admission is the server's own over the fake engine. And the writer's view of its player
(``ResponseWriter.ahead_s``) from the deltas it sent.
"""

from __future__ import annotations

import asyncio

import numpy as np

from omnistage.core import OmniOutput, OmniRequest
from omnistage.entrypoints.openai.common.admission import Admission
from omnistage.entrypoints.openai.realtime.protocol import OutputFormat, ResponseOptions
from omnistage.entrypoints.openai.realtime.response import ResponseWriter
from omnistage.entrypoints.openai.realtime.speculation_gate import SpeculationGate
from omnistage.families.qwen3_omni.prompt import Qwen3OmniPrompt
from tests.entrypoints.fake_engine import FakeEngine, fake_front_end


class FakePlayer:
    def __init__(self, ahead: float | None) -> None:
        self.ahead = ahead

    def ahead_s(self, now: float) -> float | None:
        return self.ahead


def admission(limit: int = 8) -> Admission:
    return Admission(FakeEngine(fake_front_end(None)), limit)


def test_speculation_waits_while_a_spoken_reply_is_near_running_dry() -> None:
    gate, bound = SpeculationGate(max_in_flight=4, margin_s=1.0), admission()
    assert gate.admit(bound) is not None  # nothing playing: headroom
    player = FakePlayer(0.0)  # committed, playing, nothing in hand
    ended = gate.playing(player)
    assert gate.admit(bound) is None
    player.ahead = 0.9
    assert gate.admit(bound) is None
    player.ahead = 1.0
    assert gate.admit(bound) is not None
    player.ahead = 0.2
    assert gate.admit(bound) is None
    player.ahead = None  # made in full: it no longer competes
    assert gate.admit(bound) is not None
    player.ahead = 0.2
    ended()
    ended()  # idempotent
    assert gate.admit(bound) is not None


def test_one_reply_near_its_margin_blocks_even_when_others_are_well_ahead() -> None:
    gate, bound = SpeculationGate(max_in_flight=4, margin_s=1.0), admission()
    gate.playing(FakePlayer(5.0))
    gate.playing(FakePlayer(None))
    assert gate.admit(bound) is not None
    gate.playing(FakePlayer(0.5))
    assert gate.admit(bound) is None


def test_the_cap_counts_speculative_replies_in_flight_and_frees_on_release() -> None:
    gate, bound = SpeculationGate(max_in_flight=2), admission()
    first, second = gate.admit(bound), gate.admit(bound)
    assert first is not None and second is not None
    assert gate.in_flight == 2 and bound.admitted == 2
    assert gate.admit(bound) is None
    first.release()
    first.release()  # idempotent: frees one place, once
    assert gate.in_flight == 1 and bound.admitted == 1
    third = gate.admit(bound)
    assert third is not None and gate.in_flight == 2


def test_a_full_server_refuses_speculation_without_taking_a_gate_place() -> None:
    gate, bound = SpeculationGate(max_in_flight=4), admission(limit=1)
    taken = bound.admit()  # a committed reply holds the only place
    assert gate.admit(bound) is None
    assert gate.in_flight == 0 and bound.admitted == 1
    taken.release()
    assert gate.admit(bound) is not None


def _writer(rate: int = 24000, modalities: tuple[str, ...] = ("audio",)) -> ResponseWriter:
    async def send(event: dict) -> None:
        return None

    request = OmniRequest("resp_1", Qwen3OmniPrompt([1, 2, 3]))
    options = ResponseOptions(output_modalities=modalities, instructions="", max_output_tokens=None)
    return ResponseWriter(send, "conv_1", "alloy", request, options, OutputFormat(), None, None, rate)


def test_the_writer_reports_the_audio_sent_ahead_of_a_real_time_player() -> None:
    writer = _writer(rate=24000)
    assert writer.ahead_s(0.0) is None  # no audio yet: its player has not started, it cannot run dry
    asyncio.run(writer.delta(OmniOutput("resp_1", audio=np.zeros(48000, np.float32))))  # 2 s of audio
    first = writer.first_audio_at
    assert first is not None
    assert abs(writer.ahead_s(first + 0.5) - 1.5) < 1e-9
    asyncio.run(writer.delta(OmniOutput("resp_1", audio=np.zeros(24000, np.float32))))  # 1 s more
    assert abs(writer.ahead_s(first + 2.5) - 0.5) < 1e-9
    writer.cancel()
    assert writer.ahead_s(first + 2.5) is None  # ended: nothing more will be made
    assert _writer(modalities=("text",)).ahead_s(0.0) is None  # a text reply plays nothing
