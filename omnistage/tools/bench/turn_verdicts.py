"""Smart Turn's verdicts on ``bench realtime``'s sentences, offline: ``python -m omnistage.tools.bench.turn_verdicts``.

Each sentence (``realtime_sentences.py``: a placement of its pauses and an espeak-ng
voice) is fed, 0.5 s of silence before it and 3 s after, to the detector a
``semantic_vad`` session runs (Silero, its pauses judged by the classifier through
``TurnJudge``) in the bench's microphone packets. Recorded: each verdict (the
silence heard when asked, the probability, the classifier's own time), the turns
ended inside the sentence (false starts, per pause), and for its end the silence
the detector had heard when it ended the turn (``end_silence_ms``: the packet, the
detector's lag behind the speech and the asks until a "complete"; the server adds
its queueing, the reply adds the rest). No server, no load: the classifier's part
of the bench, repeatable. Nothing here tunes anything: it reports.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass, field

import numpy as np

from omnistage.audio.silero import RATE as SILERO_RATE
from omnistage.audio.silero import WINDOW, SileroVad, load_model
from omnistage.audio.smart_turn import SmartTurn, load_smart_turn
from omnistage.audio.turn_judge import EAGERNESS_MAX_MS, SEMANTIC_PAUSE_MS, TurnJudge
from omnistage.audio.vad import VadConfig
from omnistage.tools.bench.realtime_sentences import PLACEMENTS, Sentence, sentences
from omnistage.tools.bench.realtime_speech import RATE

BEFORE_S, AFTER_S = 0.5, 3.0


@dataclass(frozen=True)
class Verdict:
    silence_ms: float  # the silence the detector had heard when it asked
    probability: float
    ms: float  # the classifier's time (features and model)


class RecordingJudge(TurnJudge):
    """A ``TurnJudge`` that keeps each verdict it gave, with the silence it was asked after."""

    def __init__(self, model: SmartTurn, rate: int, frame: int) -> None:
        super().__init__(model, rate, frame)
        self.verdicts: list[Verdict] = []
        self.silence_ms = 0.0  # set by the caller before each feed: the silence at the piece's end

    def __call__(self, start: int, end: int) -> bool:
        began = time.perf_counter()
        complete = super().__call__(start, end)
        self.verdicts.append(Verdict(self.silence_ms, float(self.last or 0.0), (time.perf_counter() - began) * 1000))
        return complete


@dataclass
class SentenceVerdicts:
    text: str
    pauses: int
    false_starts: int = 0
    end_silence_ms: float | None = None  # None: the turn did not end within AFTER_S
    at_pauses: list[Verdict] = field(default_factory=list)
    at_end: list[Verdict] = field(default_factory=list)


def judge_sentence(sentence: Sentence, model: SmartTurn, eagerness: str, packet_s: float) -> SentenceVerdicts:
    config = VadConfig(silence_duration_ms=EAGERNESS_MAX_MS[eagerness], judge_ms=SEMANTIC_PAUSE_MS)
    judge = RecordingJudge(model, SILERO_RATE, WINDOW)
    vad = SileroVad(config, RATE, load_model(), judge)
    lead = int(BEFORE_S * RATE)
    audio = np.concatenate([np.zeros(lead, np.float32), sentence.audio, np.zeros(int(AFTER_S * RATE), np.float32)])
    end, step = lead + len(sentence.audio), int(packet_s * RATE)
    pauses = [(lead + int(a * RATE), lead + int(b * RATE)) for a, b in sentence.pauses]
    out = SentenceVerdicts(sentence.text, len(sentence.pauses))
    for fed in range(step, len(audio) + step, step):
        heard = min(fed, len(audio))
        judge.silence_ms = _silence_ms(heard, end, pauses)
        asked = len(judge.verdicts)
        stops = [e for e in vad.feed(audio[heard - step:heard]) if e.kind == "speech_stopped"]
        (out.at_end if heard > end else out.at_pauses).extend(judge.verdicts[asked:])
        if stops and heard <= end:
            out.false_starts += len(stops)
        elif stops:
            out.end_silence_ms = (heard - end) * 1000 / RATE
            break
    return out


def _silence_ms(heard: int, end: int, pauses: list[tuple[int, int]]) -> float:
    """The silence (ms) just before position ``heard``: since the sentence's end or a pause's start."""
    starts = [a for a, b in pauses if a <= heard <= b] + ([end] if heard > end else [])
    return (heard - starts[0]) * 1000 / RATE if starts else 0.0


def summary(runs: list[SentenceVerdicts]) -> dict[str, object]:
    pauses = sum(r.pauses for r in runs)
    ends = [r.end_silence_ms for r in runs if r.end_silence_ms is not None]
    first_at_end = [r.at_end[0] for r in runs if r.at_end]
    first_at_pause = [r.at_pauses[0] for r in runs if r.at_pauses]
    times = [v.ms for r in runs for v in r.at_pauses + r.at_end]
    return {
        "mid_sentence_pauses": pauses, "false_starts": sum(r.false_starts for r in runs),
        "false_start_rate": sum(r.false_starts for r in runs) / pauses if pauses else None,
        "ends": len(runs), "ends_ended": len(ends),
        "end_silence_ms_p50": float(np.median(ends)) if ends else None, "end_silence_ms": sorted(ends),
        "first_verdict_complete_at_ends": _share(first_at_end), "first_verdict_complete_at_pauses": _share(
            first_at_pause),
        "first_verdict_silence_ms_p50": float(np.median([v.silence_ms for v in first_at_end])) if first_at_end
        else None,
        "classifier_ms_p50": float(np.median(times)) if times else None,
    }


def _share(verdicts: list[Verdict]) -> float | None:
    return sum(v.probability > 0.5 for v in verdicts) / len(verdicts) if verdicts else None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--placement", choices=list(PLACEMENTS), nargs="+", default=["hesitation"])
    parser.add_argument("--voice", nargs="+", default=[""], help="espeak-ng voices ('' its default, en-us+f3...)")
    parser.add_argument("--eagerness", choices=list(EAGERNESS_MAX_MS), default="auto")
    parser.add_argument("--packet-ms", type=int, default=20)
    args = parser.parse_args(argv)
    model = load_smart_turn()
    for placement in args.placement:
        for voice in args.voice:
            made, source = sentences(placement=placement, voice=voice or None)
            runs = [judge_sentence(s, model, args.eagerness, args.packet_ms / 1000) for s in made]
            print(f"{source}:{voice or 'default'} pauses at {placement}: {summary(runs)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
