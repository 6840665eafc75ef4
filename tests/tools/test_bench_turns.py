"""``omnistage bench realtime --turn-detection``: its sentences, how a session tells a false start from its turn's
end, and the level's turn-detection figures."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from omnistage.entrypoints.cli import build_parser
from omnistage.tools.bench.realtime import session_plans, summarize, turn_figures
from omnistage.tools.bench.realtime_sentences import SENTENCES, Sentence, quiet_runs, sentences, ssml
from omnistage.tools.bench.realtime_session import BenchSession, SessionPlan, TurnRecord
from omnistage.tools.bench.realtime_speech import RATE
from tests.tools.test_bench_realtime import _audio_delta


def test_pauses_are_ssml_breaks_and_are_found_again() -> None:
    assert ssml("I would like | the soup.", [0.45]) == '<speak>I would like <break time="450ms"/> the soup.</speak>'
    audio = np.concatenate([np.full(RATE // 2, 0.1, np.float32), np.zeros(RATE * 4 // 10, np.float32),
                            np.full(RATE // 2, 0.1, np.float32), np.zeros(RATE // 10, np.float32)])
    assert quiet_runs(audio) == [(0.5, 0.9)]  # 100 ms is no pause


@pytest.mark.skipif(shutil.which("espeak-ng") is None, reason="needs espeak-ng")
def test_sentences_pause_where_marked_for_300_to_700_ms() -> None:
    made, source = sentences()
    assert source == "espeak-ng" and len(made) == len(SENTENCES)
    for sentence, text in zip(made, SENTENCES):
        assert len(sentence.pauses) == text.count("|"), sentence.text
        for start, end in sentence.pauses:
            assert 0.5 < start and end < sentence.seconds - 0.5 and 0.25 <= end - start <= 0.75
    assert sum(len(s.pauses) for s in made) == 11  # seven of the twelve pause, four of them twice
    again, _ = sentences()
    assert all(np.array_equal(a.audio, b.audio) for a, b in zip(made, again))  # the same speech every run


def _session() -> BenchSession:
    said = (Sentence("a b", np.zeros(RATE, np.float32), ((0.3, 0.7),)),)
    return BenchSession(SessionPlan("ws://unused", 1.0, 1, None, 24, False, np.zeros(RATE, np.float32), 0.0,
                                    turn_detection="semantic_vad", sentences=said))


def test_a_turn_ended_mid_sentence_is_a_false_start_kept_apart_from_the_turn() -> None:
    session = _session()
    turn = TurnRecord(1.0, pauses=1)
    session._pending = session._speaking = turn
    session._on_event({"type": "input_audio_buffer.speech_stopped"}, 1.0)  # at the pause inside the sentence
    session._on_event({"type": "response.created", "response": {"id": "early"}}, 1.1)
    session._on_event(_audio_delta("early", RATE // 10), 1.2)  # the agent talks over the user
    session._on_event({"type": "response.done", "response": {"id": "early", "status": "cancelled"}}, 1.3)
    assert turn.false_starts == 1 and turn.stopped is None and turn.first_audio is None
    assert not session._finished.is_set()  # the turn's own reply is still to come
    session._speaking, turn.eos = None, 2.0  # the sentence's last packet went out
    session._on_event({"type": "input_audio_buffer.speech_stopped"}, 2.25)
    session._on_event({"type": "response.created", "response": {"id": "reply"}}, 2.3)
    session._on_event(_audio_delta("reply", RATE // 10), 2.4)
    session._on_event({"type": "response.done", "response": {"id": "reply", "status": "completed"}}, 2.5)
    assert turn.stopped == 2.25 and turn.first_audio == 2.4 and turn.ok and session._finished.is_set()
    figures = turn_figures([turn], session.false_replies, "semantic_vad", "auto")
    assert figures["false_start_rate"] == 1.0 and figures["cut_offs"] == 1
    assert figures["ends_judged_complete"] == 1.0  # ended 250 ms after the speech: well before 4 s / 2


def test_turn_figures_per_pause_and_the_classifiers_decisions() -> None:
    turns = [TurnRecord(3.0, eos=10.0, stopped=10.25, pauses=2, false_starts=1),
             TurnRecord(3.0, eos=20.0, stopped=24.1, pauses=1),  # judged incomplete: 4 s (medium's longest) later
             TurnRecord(3.0, eos=30.0, stopped=30.3)]
    semantic = turn_figures(turns, [TurnRecord(0.0)], "semantic_vad", "medium")
    assert semantic["false_start_rate"] == pytest.approx(1 / 3) and semantic["cut_offs"] == 0
    assert semantic["ends_judged_complete"] == pytest.approx(2 / 3)
    assert semantic["pauses_judged_complete"] == pytest.approx(1 / 3)
    server = turn_figures(turns, [], "server_vad", "medium")
    assert server["turn_detection"] == "server_vad" and server["false_start_rate"] == pytest.approx(1 / 3)
    assert server["ends_judged_complete"] is None and server["eagerness"] is None  # no classifier
    assert turn_figures([TurnRecord(2.0)], [], "server_vad", "auto")["false_start_rate"] is None  # no pauses


def test_sessions_speak_sentences_under_the_asked_detection() -> None:
    args = build_parser().parse_args(["bench", "realtime", "--turn-detection", "semantic", "server",
                                      "--eagerness", "high", "--concurrency", "2"])
    assert args.turn_detection == ["semantic", "server"] and args.eagerness == "high"
    said = (Sentence("a", np.full(RATE, 0.5, np.float32), ()), Sentence("b", np.full(RATE, 0.5, np.float32), ()))
    plans = session_plans("ws://x", 2, 1.0, True, args, np.zeros(RATE, np.float32), 3, said, "semantic_vad")
    assert [p.first_sentence for p in plans] == [0, 5] and plans[0].turn_detection == "semantic_vad"
    assert plans[0].sentences[0].audio[0] == pytest.approx(0.5 * (1 - 3 * 0.002))  # each level a little quieter
    session = BenchSession(plans[0])
    assert session._session()["audio"]["input"]["turn_detection"] == {"type": "semantic_vad", "eagerness": "high"}
    level = summarize(1, 1.0, True, [[TurnRecord(1.0)]], [], 0.0)
    assert "underrun_streams" in level
