"""``turn_verdicts``: the bench's sentences through the server's own semantic_vad detector, offline. A finished
question ends its turn after the silence the detector needs (at least the first ask's 128 ms, at most a few asks);
a sentence with a long pause inside is asked there too; the summary counts what it saw."""

from __future__ import annotations

import numpy as np
import pytest

from omnistage.audio.decode import resample
from omnistage.audio.smart_turn import load_smart_turn
from omnistage.tools.bench.realtime_sentences import Sentence
from omnistage.tools.bench.realtime_speech import RATE
from omnistage.tools.bench.turn_verdicts import SentenceVerdicts, Verdict, judge_sentence, summary
from tests.audio.test_smart_turn import needs_espeak, spoken

pytest.importorskip("onnxruntime")


def at_24k(*pieces: np.ndarray) -> np.ndarray:
    return resample(np.concatenate(pieces), 16000, RATE).astype(np.float32)


@pytest.mark.slow  # seconds on a quiet machine, minutes on a loaded one (a dozen classifier runs, Silero per 32 ms)
@needs_espeak
def test_a_finished_question_ends_after_the_first_asks_silence_and_a_pause_inside_is_asked() -> None:
    model = load_smart_turn()
    question = Sentence("What is the weather like tomorrow?", at_24k(spoken("What is the weather like tomorrow?",
                                                                             tail_s=0.0)), ())
    run = judge_sentence(question, model, "auto", 0.02)
    assert run.false_starts == 0 and run.at_end and run.at_end[0].silence_ms >= 128
    assert run.end_silence_ms is not None and 128 <= run.end_silence_ms <= 1100  # the first asks, not 4 s
    head, rest = spoken("I would like to know what the", tail_s=0.0), spoken("weather will be like.", tail_s=0.0)
    paused = Sentence("x", at_24k(head, np.zeros(9600, np.float32), rest), ((len(head) / 16000, len(head) / 16000
                                                                             + 0.6),))
    run = judge_sentence(paused, model, "auto", 0.02)
    assert run.at_pauses and all(v.silence_ms < 600 for v in run.at_pauses)  # asked inside the 600 ms pause
    assert run.false_starts in (0, 1)


def test_summary_counts_false_starts_and_first_verdicts() -> None:
    complete, incomplete = Verdict(130, 0.9, 10.0), Verdict(130, 0.2, 12.0)
    runs = [SentenceVerdicts("a", 2, 1, 200.0, [complete, incomplete], [incomplete, complete]),
            SentenceVerdicts("b", 0, 0, 130.0, [], [complete]), SentenceVerdicts("c", 1, 0, None, [incomplete], [])]
    figures = summary(runs)
    assert figures["false_start_rate"] == pytest.approx(1 / 3) and figures["ends_ended"] == 2
    assert figures["end_silence_ms_p50"] == pytest.approx(165.0)
    assert figures["first_verdict_complete_at_ends"] == pytest.approx(0.5)
    assert figures["first_verdict_complete_at_pauses"] == pytest.approx(0.5)
