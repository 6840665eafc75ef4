"""``omnistage bench realtime``: its figures from recorded turns, its speech packets and its arguments."""

from __future__ import annotations

import numpy as np
import pytest

from omnistage.entrypoints.cli import build_parser
from omnistage.tools.bench.realtime import summarize
from omnistage.tools.bench.realtime_session import BargeIn, TurnRecord
from omnistage.tools.bench.realtime_speech import RATE, appends, shorten_pauses, utterance


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
    assert level["reply_rtf_p50"] == pytest.approx(np.percentile([0.4, 1.2, 0.4], 50))
    assert level["barge_in_stop_ms_p50"] == pytest.approx(120.0) and level["barge_ins"] == 1
    assert level["barge_in_cancel_ms_p50"] == pytest.approx(300.0)
    assert level["prefill_tokens_per_turn"] == [105.0, 90.0]  # the failed turn is not counted


def test_barge_in_before_onset_stops_at_zero() -> None:
    assert BargeIn(5.0, 4.9).stop_ms == 0.0
    assert BargeIn(5.0, None).stop_ms is None
    assert BargeIn(5.0, 5.1, done=5.4, status="completed").cancel_ms is None  # not interrupted


def test_speech_pauses_are_shortened_and_packets_are_100_ms() -> None:
    voiced = 0.5 * np.sin(np.arange(RATE) * 2 * np.pi * 200 / RATE).astype(np.float32)
    speech = np.concatenate([np.zeros(RATE // 2), voiced, np.zeros(RATE), voiced, np.zeros(RATE // 3)])
    short = shorten_pauses(speech.astype(np.float32), max_pause_s=0.2)
    assert len(short) == pytest.approx(2 * RATE + 0.2 * RATE, abs=RATE // 100)  # inner 1 s pause cut to 0.2 s
    cut = utterance(short, 5.0)  # longer than the paragraph: looped
    assert len(cut) == 5 * RATE
    packets = appends(cut)
    assert len(packets) == 50 and all(len(p) == 2 * RATE // 10 for p in packets)


def test_cli_arguments() -> None:
    args = build_parser().parse_args(["bench", "realtime", "--model", "medium", "--concurrency", "1,4",
                                      "--utterance-seconds", "2,8,20", "--streaming-input", "off"])
    assert args.concurrency == [1, 4] and args.utterance_seconds == [2.0, 8.0, 20.0]
    assert args.streaming_input == "off" and args.turns == 3
    with pytest.raises(SystemExit):
        build_parser().parse_args(["bench", "realtime", "--utterance-seconds", "0"])
