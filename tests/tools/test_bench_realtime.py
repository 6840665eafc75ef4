"""``omnistage bench realtime``: its figures from recorded turns, its speech packets and its arguments."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from omnistage.entrypoints.cli import build_parser
from omnistage.tools.bench.realtime import TURN_OVERHEAD_S, session_plans, start_offsets, summarize
from omnistage.tools.bench.realtime_session import BargeIn, BenchSession, SessionPlan, TurnAlignment, TurnRecord
from omnistage.tools.bench.realtime_speech import RATE, appends, pcm16, shorten_pauses, utterance


def _turn(eos: float, first_audio: float, packets: int, gap: float, input_tokens: int, cached: int,
          status: str = "completed") -> TurnRecord:
    turn = TurnRecord(2.0, eos=eos, first_audio=first_audio, first_text=first_audio - 0.05, status=status,
                      input_tokens=input_tokens, cached_tokens=cached)
    turn.audio = [(first_audio + i * gap, RATE // 10) for i in range(packets)]  # 100 ms of audio per packet
    turn.done = turn.audio[-1][0]
    return turn


def test_summary_of_recorded_turns() -> None:
    # Two sessions of two turns; one reply arrives slower than real time (150 ms per 100 ms packet).
    a = [_turn(10.0, 10.3, 5, 0.05, 100, 0), _turn(20.0, 20.5, 5, 0.15, 180, 90, status="incomplete")]
    b = [_turn(10.0, 10.4, 5, 0.05, 110, 0), _turn(20.0, 20.2, 5, 0.05, 190, 100, status="failed")]
    barges = [BargeIn(1.0, 1.12, done=1.3, status="cancelled"), BargeIn(1.0, None)]
    level = summarize(2, 2.0, True, [a, b], barges, underrun_tolerance_s=0.0)
    assert level["turns"] == 4 and level["failed_turns"] == 1
    assert level["eos_to_first_audio_ms_p50"] == pytest.approx(np.percentile([300, 500, 400], 50))
    assert level["eos_to_first_text_ms_p50"] == pytest.approx(np.percentile([250, 450, 350], 50))
    assert level["underrun_streams"] == 1  # only the slow reply would run a player dry
    assert level["underrun_ms_max"] == pytest.approx(200.0)  # its fifth packet comes 600 ms in, 400 ms of audio
    assert level["reply_rtf_p50"] == pytest.approx(np.percentile([0.4, 1.2, 0.4], 50))
    assert level["barge_in_stop_ms_p50"] == pytest.approx(120.0) and level["barge_ins"] == 1
    assert level["barge_in_cancel_ms_p50"] == pytest.approx(300.0)
    assert level["prefill_tokens_per_turn"] == [105.0, 90.0]  # the failed turn is not counted


def test_speech_stopped_times_exclude_the_vad_wait() -> None:
    a = _turn(10.0, 10.9, 5, 0.05, 100, 0)
    a.stopped = 10.6  # the server's VAD heard 600 ms of silence
    b = _turn(20.0, 20.8, 5, 0.05, 100, 0)  # no speech_stopped seen: only in the end-of-speech figures
    level = summarize(1, 2.0, False, [[a, b]], [], underrun_tolerance_s=0.0)
    assert level["speech_stopped_to_first_audio_ms_p50"] == pytest.approx(300.0)
    assert level["vad_wait_ms_p50"] == pytest.approx(600.0)
    assert level["eos_to_first_audio_ms_p50"] == pytest.approx(850.0)
    # Each turn's figures, sorted: the one without speech_stopped is only in the end-of-speech list.
    assert level["eos_to_first_audio_ms"] == pytest.approx([800.0, 900.0])
    assert level["speech_stopped_to_first_audio_ms"] == pytest.approx([300.0])
    assert level["vad_wait_ms"] == pytest.approx([600.0])


def _session(reply_audio_s: float) -> BenchSession:
    plan = SessionPlan("ws://unused", 2.0, 1, None, 24, False, np.zeros(RATE, np.float32), 0.0,
                       reply_audio_s=reply_audio_s)
    return BenchSession(plan)


def _audio_delta(response_id: str, samples: int) -> dict[str, str]:
    import base64

    return {"type": "response.output_audio.delta", "response_id": response_id,
            "delta": base64.b64encode(bytes(2 * samples)).decode()}


def test_a_reply_is_cancelled_once_when_heard_enough() -> None:
    session = _session(reply_audio_s=1.0)
    turn = TurnRecord(2.0)
    session._pending = turn
    session._on_event({"type": "input_audio_buffer.speech_stopped"}, 5.0)
    session._on_event({"type": "response.created", "response": {"id": "r1"}}, 5.1)
    cuts = [session._on_event(_audio_delta("r1", RATE // 4), 5.2 + i / 10) for i in range(6)]
    assert cuts == [False, False, False, True, False, False]  # 1 s of audio after the fourth 250 ms delta
    assert turn.stopped == 5.0 and turn.first_audio == pytest.approx(5.2)
    session._on_event({"type": "response.done", "response": {"id": "r1", "status": "cancelled"}}, 6.0)
    assert turn.cut and turn.ok  # cancelled by the client: a measured turn, not a failure
    assert turn.prefill_tokens is None  # a cancelled reply's response.done has no usage
    level = summarize(1, 2.0, True, [[turn]], [], underrun_tolerance_s=0.0)
    assert level["prefill_tokens_per_turn"] == [] and level["eos_to_first_audio_ms_p50"] is not None
    whole = _session(reply_audio_s=0.0)
    whole._pending = TurnRecord(2.0)
    whole._on_event({"type": "response.created", "response": {"id": "r2"}}, 1.0)
    assert not any(whole._on_event(_audio_delta("r2", RATE), 1.1 + i) for i in range(5))


def test_a_reply_cancelled_by_the_server_is_a_failure() -> None:
    turn = TurnRecord(2.0, first_audio=1.0, status="cancelled")
    assert not turn.ok


def test_barge_in_before_onset_stops_at_zero() -> None:
    assert BargeIn(5.0, 4.9).stop_ms == 0.0
    assert BargeIn(5.0, None).stop_ms is None
    assert BargeIn(5.0, 5.1, done=5.4, status="completed").cancel_ms is None  # not interrupted


def test_speech_pauses_are_shortened_and_packets_are_20_ms_or_as_asked() -> None:
    voiced = 0.5 * np.sin(np.arange(RATE) * 2 * np.pi * 200 / RATE).astype(np.float32)
    speech = np.concatenate([np.zeros(RATE // 2), voiced, np.zeros(RATE), voiced, np.zeros(RATE // 3)])
    short = shorten_pauses(speech.astype(np.float32), max_pause_s=0.2)
    assert len(short) == pytest.approx(2 * RATE + 0.2 * RATE, abs=RATE // 100)  # inner 1 s pause cut to 0.2 s
    cut = utterance(short, 5.0)  # longer than the paragraph: looped
    assert len(cut) == 5 * RATE
    packets = appends(cut)  # WebRTC's 20 ms
    assert len(packets) == 250 and all(len(p) == 2 * RATE // 50 for p in packets)
    packets = appends(cut, 0.1)
    assert len(packets) == 50 and all(len(p) == 2 * RATE // 10 for p in packets)


def test_utterances_of_any_length_end_with_the_same_words() -> None:
    rng = np.random.default_rng(0)
    speech = rng.uniform(-0.5, 0.5, int(3.3 * RATE)).astype(np.float32)
    short, long = utterance(speech, 2.0, end_s=2.5), utterance(speech, 20.0, end_s=2.5)  # the long one loops
    assert len(short) == 2 * RATE and len(long) == 20 * RATE
    np.testing.assert_array_equal(long[-len(short):], short)
    np.testing.assert_array_equal(short, speech[int(0.5 * RATE):int(2.5 * RATE)])
    # Past one loop (the paragraph and its 200 ms pause) the same end comes back.
    period_s = len(speech) / RATE + 0.2
    np.testing.assert_array_equal(utterance(speech, 2.0, end_s=2.5 + period_s), short)
    assert not np.array_equal(utterance(speech, 2.0, end_s=2.6), short)


def test_a_levels_modes_and_lengths_end_turns_alike_in_speech_of_their_own() -> None:
    args = build_parser().parse_args(["bench", "realtime", "--concurrency", "2"])
    speech = np.full(RATE, 0.5, np.float32)
    off = session_plans("ws://unused", 2, 2.0, False, args, speech, 0)
    on = session_plans("ws://unused", 2, 20.0, True, args, speech, 3)
    assert [p.end_s for p in off] == [p.end_s for p in on] and off[0].end_s != off[1].end_s
    # The same words at another level are other samples (no shared prefix cache), a level's sessions alike.
    np.testing.assert_array_equal(off[0].speech, off[1].speech)
    assert pcm16(off[0].speech) != pcm16(on[0].speech)
    np.testing.assert_allclose(on[0].speech, speech, rtol=0.01)


def test_cli_arguments() -> None:
    args = build_parser().parse_args(["bench", "realtime", "--model", "medium", "--concurrency", "1,4",
                                      "--utterance-seconds", "2,8,20", "--streaming-input", "off"])
    assert args.concurrency == [1, 4] and args.utterance_seconds == [2.0, 8.0, 20.0]
    assert args.streaming_input == "off" and args.turns == 3 and args.start == "staggered"
    assert build_parser().parse_args(["bench", "realtime", "--start", "together"]).start == "together"
    with pytest.raises(SystemExit):
        build_parser().parse_args(["bench", "realtime", "--utterance-seconds", "0"])


def test_staggered_sessions_spread_over_a_turn_cycle() -> None:
    cycle = 20.0 + TURN_OVERHEAD_S
    assert start_offsets(4, 20.0, staggered=True) == pytest.approx([0.0, cycle / 4, cycle / 2, 3 * cycle / 4])
    assert start_offsets(1, 2.0, staggered=True) == [0.0]
    assert start_offsets(4, 20.0, staggered=False) == [0.0] * 4


def test_aligned_turns_start_once_every_running_session_is_ready() -> None:
    async def scenario() -> None:
        alignment = TurnAlignment(3)
        first = [alignment.arrive(0), alignment.arrive(1)]
        assert not any(e.is_set() for e in first)  # the third session is still in its turn
        first.append(alignment.arrive(2))
        assert all(e.is_set() for e in first)
        # The next turn waits afresh; a session that ends no longer holds the others back.
        second = [alignment.arrive(1), alignment.arrive(2)]
        assert not any(e.is_set() for e in second)
        alignment.leave(0)
        assert all(e.is_set() for e in second)
        # Two sessions remain: one alone is not enough, and a session arriving twice counts once.
        third = [alignment.arrive(1), alignment.arrive(1)]
        assert not third[0].is_set() and third[0] is third[1]
        assert alignment.arrive(2).is_set()

    asyncio.run(scenario())


def test_together_sessions_share_one_alignment_and_staggered_have_none() -> None:
    def plans(start: str) -> list[SessionPlan]:
        args = build_parser().parse_args(["bench", "realtime", "--concurrency", "3", "--start", start])
        return session_plans("ws://unused", 3, 2.0, True, args, np.zeros(RATE, np.float32), 0)

    together = plans("together")
    assert len(together) == 3 and together[0].alignment is not None
    assert all(p.alignment is together[0].alignment and p.start_s == 0.0 for p in together)
    staggered = plans("staggered")
    assert all(p.alignment is None for p in staggered) and staggered[1].start_s > 0


class _RecordingSocket:
    def __init__(self) -> None:
        self.sent: list[str] = []

    async def send(self, message: str) -> None:
        self.sent.append(message)


def test_an_aligned_session_sends_silence_until_the_others_are_ready() -> None:
    import dataclasses
    import json
    import time

    async def scenario() -> None:
        alignment = TurnAlignment(2)
        session = BenchSession(dataclasses.replace(_session(0.0).plan, alignment=alignment))
        session._ws, session._clock = _RecordingSocket(), time.perf_counter()
        waiting = asyncio.create_task(session._align())
        await asyncio.sleep(0.25)
        assert not waiting.done()  # the other session is still in its turn
        assert len(session._ws.sent) >= 2  # a microphone never stops: silence meanwhile
        assert all(json.loads(m)["type"] == "input_audio_buffer.append" for m in session._ws.sent)
        alignment.arrive(-1)  # the other session is ready
        await asyncio.wait_for(waiting, 1.0)

    asyncio.run(scenario())
