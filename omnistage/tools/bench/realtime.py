"""``omnistage bench realtime``: voice-agent latency over ``WS /v1/realtime`` with server VAD.

N concurrent sessions (``realtime_session.py``) each speak several turns of
espeak-ng speech at real-time pace and let server VAD end each turn. Per level
(concurrency × utterance length × streaming input): end of speech → first audio
delta and → first text delta (p50, p95), the same from the server's ``speech_stopped``
(its VAD silence wait excluded) and that wait (those three also every turn's,
sorted), the reply's RTF (wall seconds per audio
second after its first audio), streams that would underrun a player, the
prompt tokens each turn prefilled (``usage``: input minus cached), the
barge-in stop time, and the server's speculative replies in the level, used and
dropped (a false end: started at a pause the user spoke on from; ``/metrics``).
``--streaming-input both`` (default) measures every level with and without the
server's streaming input prefill, alternating which goes first, so the two share
the machine's state. A session's turns end with the same words at every level, so both modes and
every length wait the same VAD silence; each level's speech is 0.2% quieter than the
last, so no level hits the prefix caches another filled with its audio.

``--start staggered`` (default) spreads the sessions' first turns evenly over one
turn's cycle, as independent users' turns fall; ``together`` starts every turn
of every session at once (within a packet), the worst case: every turn's
replies come as one burst. Each session waits (its microphone sending silence) until every
other has heard its reply before its next turn; without that, a slow reply would
shift its session's later turns, how long the sessions stayed aligned would be
chance, and it would differ between utterance lengths, mixing length with
alignment. Either way, every level has the same phases.

``--turn-detection semantic server`` (either or both) measures turn detection
instead of utterance lengths: each turn is one whole sentence, seven of twelve with
300–700 ms pauses inside (``realtime_sentences.py``), under ``semantic_vad``
(``--eagerness``) or ``server_vad``. Each level then also reports its false
starts (a turn ended while its sentence was still being spoken, per pause inside
one: ``false_start_rate``), its cut-offs (such a reply's audio reached the user
before it was cancelled) and, for semantic_vad, the classifier's decisions as
the client sees them: a finished sentence ended well before the eagerness's
longest wait is a "complete", a pause that ended a turn is a "complete" too.

The server is ``--url`` (a running ``omnistage serve``), or else one started
here for the run (``omnistage serve MODEL`` on a free local port).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import re
import shlex
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import numpy as np

from omnistage.audio.turn_judge import EAGERNESS_MAX_MS
from omnistage.tools.bench.realtime_sentences import Sentence, sentences
from omnistage.tools.bench.realtime_session import BargeIn, BenchSession, SessionPlan, TurnAlignment, TurnRecord
from omnistage.tools.bench.realtime_speech import shorten_pauses, synthesize

SERVER_START_TIMEOUT_S = 900.0  # a first run may build the embedded checkpoint
# A turn's cycle beyond its speech: the breath before it, the VAD's silence wait, and the reply heard (4 s of audio
# at the medium checkpoint's ~0.3 reply RTF), roughly: it only spreads the sessions' phases.
TURN_OVERHEAD_S = 2.5
# Where session i's first turn ends in the (looped) paragraph: FIRST_END_S + i * SESSION_END_STEP_S seconds.
FIRST_END_S, SESSION_END_STEP_S = 2.0, 3.7
# Each level's speech is this much quieter than the last (0.2%: inaudible, and the VAD's waits stay the same).
LEVEL_GAIN_STEP = 0.002


def _modes(choice: str) -> list[bool | None]:
    return {"on": [True], "off": [False], "both": [False, True], "server": [None]}[choice]


def start_offsets(concurrency: int, utterance_s: float, staggered: bool) -> list[float]:
    """Seconds each session waits (sending silence) before its first turn: spread evenly over one turn's cycle, or
    none (every session's turns start together: ``TurnAlignment`` keeps them so)."""
    cycle = utterance_s + TURN_OVERHEAD_S
    return [cycle * i / concurrency if staggered else 0.0 for i in range(concurrency)]


def _pct(values: list[float], p: float) -> float | None:
    return float(np.percentile(values, p)) if values else None


def turn_figures(turns: list[TurnRecord], false_replies: list[TurnRecord], detection: str,
                 eagerness: str) -> dict[str, object]:
    """False starts per pause inside a sentence, cut-offs, and (semantic_vad) the classifier's decisions as seen:
    a sentence's end judged complete when its turn ended before half the eagerness's longest wait."""
    pauses, false = sum(t.pauses for t in turns), sum(t.false_starts for t in turns)
    ends = [t.stopped - t.eos for t in turns if t.stopped is not None]
    semantic = detection == "semantic_vad"
    half_s = EAGERNESS_MAX_MS[eagerness] / 2000
    return {"turn_detection": detection, "eagerness": eagerness if semantic else None,
            "mid_sentence_pauses": pauses, "false_starts": false, "false_start_rate": false / pauses if pauses else None,
            "cut_offs": sum(1 for r in false_replies if r.first_audio is not None),
            "ends_judged_complete": sum(1 for e in ends if e < half_s) / len(ends) if semantic and ends else None,
            "pauses_judged_complete": false / pauses if semantic and pauses else None}


def summarize(concurrency: int, utterance_s: float, streaming: bool | None, sessions: list[list[TurnRecord]],
              barges: list[BargeIn], underrun_tolerance_s: float) -> dict[str, object]:
    """One level's figures; ``sessions``: each session's turns in order."""
    turns = [t for session in sessions for t in session]
    ok = [t for t in turns if t.ok]
    audio_ms = [(t.first_audio - t.eos) * 1000 for t in ok]
    heard = [t for t in ok if t.stopped is not None]  # the VAD's silence wait excluded
    stopped_ms = [(t.first_audio - t.stopped) * 1000 for t in heard]
    vad_ms = [(t.stopped - t.eos) * 1000 for t in heard]
    text_ms = [(t.first_text - t.eos) * 1000 for t in ok if t.first_text is not None]
    rtf = [(t.done - t.first_audio) / s for t in ok if (s := t.stream().audio_seconds) > 0]
    shortfalls = [t.stream().underrun_s() for t in ok]
    per_turn: dict[int, list[int]] = {}
    for session in sessions:
        for i, t in enumerate(session):
            if t.ok and t.prefill_tokens is not None:  # cut replies carry no usage: --reply-audio-seconds 0
                per_turn.setdefault(i, []).append(t.prefill_tokens)
    stops = [b.stop_ms for b in barges if b.stop_ms is not None]
    cancels = [b.cancel_ms for b in barges if b.cancel_ms is not None]
    return {
        "concurrency": concurrency, "utterance_s": utterance_s, "streaming_input": streaming,
        "turns": len(turns), "failed_turns": len(turns) - len(ok),
        "errors": sorted({t.error for t in turns if t.error})[:3],
        "eos_to_first_audio_ms_p50": _pct(audio_ms, 50), "eos_to_first_audio_ms_p95": _pct(audio_ms, 95),
        "eos_to_first_text_ms_p50": _pct(text_ms, 50), "eos_to_first_text_ms_p95": _pct(text_ms, 95),
        "speech_stopped_to_first_audio_ms_p50": _pct(stopped_ms, 50),
        "speech_stopped_to_first_audio_ms_p95": _pct(stopped_ms, 95), "vad_wait_ms_p50": _pct(vad_ms, 50),
        "reply_rtf_p50": _pct(rtf, 50),
        "underrun_streams": sum(1 for s in shortfalls if s > underrun_tolerance_s),
        "underrun_ms_max": max(shortfalls) * 1000 if shortfalls else None,
        "barge_in_stop_ms_p50": _pct(stops, 50), "barge_in_cancel_ms_p50": _pct(cancels, 50), "barge_ins": len(stops),
        "prefill_tokens_per_turn": [float(np.mean(per_turn[i])) for i in sorted(per_turn)],
        # Each turn's figures (sorted): a p50 over a dozen turns can sit between two modes, and these show which.
        "eos_to_first_audio_ms": _ms(audio_ms), "speech_stopped_to_first_audio_ms": _ms(stopped_ms),
        "vad_wait_ms": _ms(vad_ms),
    }


def _ms(values: list[float]) -> list[float]:
    return sorted(round(v, 1) for v in values)


def session_plans(url: str, concurrency: int, utterance_s: float, streaming: bool | None, args: argparse.Namespace,
                  speech: np.ndarray, level: int, said: tuple[Sentence, ...] = (),
                  detection: str = "server_vad") -> list[SessionPlan]:
    """One level's sessions. Session ``i``'s turns end with the same words at every level, so a level's on and off
    modes, and its utterance lengths, are compared over the same VAD silence waits (a packet more or less
    when speech ends mid-word, which would otherwise fall on one mode's turns and not the other's). Each level's
    speech is a little quieter than the last (``LEVEL_GAIN_STEP``): the VAD hears it alike, but its samples differ,
    so no level's prompts hit the prefix caches an earlier level filled with that audio."""
    staggered = args.start == "staggered"
    starts = start_offsets(concurrency, utterance_s, staggered)
    alignment = None if staggered else TurnAlignment(concurrency)
    gain = 1.0 - LEVEL_GAIN_STEP * level
    spoken = (speech * gain).astype(np.float32)
    said = tuple(replace(s, audio=(s.audio * gain).astype(np.float32)) for s in said)
    return [SessionPlan(url, utterance_s, args.turns, streaming, args.reply_tokens, args.barge_in, spoken,
                        end_s=SESSION_END_STEP_S * i + FIRST_END_S, reply_audio_s=args.reply_audio_seconds,
                        start_s=starts[i], alignment=alignment, turn_detection=detection,
                        eagerness=getattr(args, "eagerness", "auto"), sentences=said, first_sentence=5 * i,
                        packet_s=getattr(args, "packet_ms", 20) / 1000)
            for i in range(concurrency)]


async def run_level(url: str, concurrency: int, utterance_s: float, streaming: bool | None, args: argparse.Namespace,
                    speech: np.ndarray, level: int, said: tuple[Sentence, ...] = (),
                    detection: str = "server_vad") -> tuple[list[BenchSession], list[BargeIn]]:
    sessions = [BenchSession(plan) for plan in session_plans(url, concurrency, utterance_s, streaming, args, speech,
                                                             level, said, detection)]
    results = await asyncio.gather(*(s.run() for s in sessions), return_exceptions=True)
    for session, result in zip(sessions, results):
        if isinstance(result, BaseException):
            session.turns.append(TurnRecord(utterance_s, error=f"{type(result).__name__}: {result}"))
    return sessions, [s.barge for s in sessions if s.barge is not None]


@contextlib.contextmanager
def local_server(model: str, extra: list[str]) -> Iterator[str]:
    """``omnistage serve MODEL`` on a free port for the run; yields its base URL."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, "-c", "from omnistage.entrypoints.cli import main; raise SystemExit(main())",
           "serve", model, "--host", "127.0.0.1", "--port", str(port), *extra]
    proc = subprocess.Popen(cmd)
    try:
        _wait_healthy(f"http://127.0.0.1:{port}", proc)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()


def _wait_healthy(base: str, proc: subprocess.Popen) -> None:
    import httpx

    deadline = time.monotonic() + SERVER_START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited with code {proc.returncode} before it was ready")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{base}/health", timeout=5).status_code == 200:
                return
        time.sleep(1.0)
    raise RuntimeError(f"the server was not ready after {SERVER_START_TIMEOUT_S:g} s")


def _served_name(base: str) -> str:
    import httpx

    return httpx.get(f"{base}/v1/models", timeout=30).json()["data"][0]["id"]


def speculations(base: str) -> dict[str, int]:
    """The server's speculative replies so far (``/metrics``): ``used`` (the turn ended at the pause that started
    one) and ``dropped`` (a false end: the user spoke on, or the session changed first)."""
    import httpx

    counts = {"used": 0, "dropped": 0}
    with contextlib.suppress(httpx.HTTPError):
        text = httpx.get(f"{base}/metrics", timeout=30).text
        for outcome, value in re.findall(r'omnistage_realtime_speculative_replies_total\{outcome="(\w+)"\} (\S+)',
                                         text):
            counts[outcome] = int(float(value))
    return counts


def _fmt(v: object) -> str:
    if isinstance(v, float):
        return f"{v:.0f}" if abs(v) >= 10 else f"{v:.2f}"
    return "-" if v is None else str(v)


def print_table(levels: list[dict[str, object]]) -> None:
    cols = ("concurrency", "utterance_s", "streaming_input", "eos_to_first_audio_ms_p50", "eos_to_first_audio_ms_p95",
            "speech_stopped_to_first_audio_ms_p50", "vad_wait_ms_p50", "eos_to_first_text_ms_p50", "reply_rtf_p50",
            "underrun_streams", "underrun_ms_max", "barge_in_stop_ms_p50", "barge_in_cancel_ms_p50", "failed_turns",
            "speculative_used", "speculative_dropped", "turn_detection", "false_start_rate", "cut_offs",
            "ends_judged_complete", "prefill_tokens_per_turn")
    short = ("conc", "utt_s", "stream", "audio_p50", "audio_p95", "stop>aud50", "vad_p50", "text_p50", "rtf",
             "underrun", "under_max", "barge_p50", "cancel_p50", "fail", "spec_used", "spec_drop", "detection",
             "false_st", "cut_offs", "end_cmpl", "prefill/turn")
    print(" ".join(f"{c:>10}" for c in short))
    for level in levels:
        cells = [", ".join(f"{x:.0f}" for x in level[c]) or "-" if c == "prefill_tokens_per_turn" else
                 _fmt(level.get(c)) for c in cols]
        print(" ".join(f"{c:>10}" for c in cells))
        if level["errors"]:
            print(f"{'':>10} errors: {level['errors']}")


def _groups(args: argparse.Namespace, said: tuple[Sentence, ...]) -> list[tuple[float, str]]:
    """(utterance seconds, turn detection) of each group of levels at one concurrency: the utterance lengths under
    server_vad, or with sentences each asked turn detection (their mean length stands for the utterance's)."""
    if not said:
        return [(u, "server_vad") for u in args.utterance_seconds]
    mean_s = float(np.mean([s.seconds for s in said]))
    return [(mean_s, f"{name}_vad") for name in args.turn_detection]


async def _level(base: str, url: str, concurrency: int, utterance_s: float, streaming: bool | None,
                 args: argparse.Namespace, speech: np.ndarray, level: int, said: tuple[Sentence, ...],
                 detection: str) -> dict[str, object]:
    before = await asyncio.to_thread(speculations, base)
    sessions, barges = await run_level(url, concurrency, utterance_s, streaming, args, speech, level, said, detection)
    turns = [s.turns for s in sessions]
    figures = summarize(concurrency, utterance_s, streaming, turns, barges, args.underrun_tolerance)
    figures.update(turn_figures([t for ts in turns for t in ts], [r for s in sessions for r in s.false_replies],
                                detection, getattr(args, "eagerness", "auto")))
    after = await asyncio.to_thread(speculations, base)
    figures.update({f"speculative_{name}": after[name] - before[name] for name in after})
    figures["start"] = args.start
    return figures


async def _bench(base: str, args: argparse.Namespace) -> list[dict[str, object]]:
    name = args.served_model or _served_name(base)
    url = base.replace("http", "ws", 1) + f"/v1/realtime?model={name}"
    speech, source = synthesize()
    speech = shorten_pauses(speech)
    print(f"speech: {source}, {len(speech) / 24000:.1f} s paragraph")
    said: tuple[Sentence, ...] = ()
    if getattr(args, "turn_detection", None):
        made, source = sentences()
        said = tuple(made)
        print(f"sentences: {source}, {len(said)}, {sum(len(s.pauses) for s in said)} pauses inside them")
    levels: list[dict[str, object]] = []
    k = 0
    for concurrency in args.concurrency:
        for utterance_s, detection in _groups(args, said):
            modes = _modes(args.streaming_input)
            for streaming in modes if k % 2 == 0 else modes[::-1]:  # alternate which mode runs first
                levels.append(await _level(base, url, concurrency, utterance_s, streaming, args, speech, len(levels),
                                           said, detection))
                print_table(levels[-1:])
            k += 1
    return levels


def main(args: argparse.Namespace) -> int:
    if args.url:
        levels = asyncio.run(_bench(args.url.rstrip("/"), args))
    else:
        with local_server(args.model, shlex.split(args.server_args)) as base:
            levels = asyncio.run(_bench(base, args))
    print("\nall levels:")
    print_table(levels)
    if args.json_out:
        payload = {"model": str(args.model), "turns": args.turns, "reply_tokens": args.reply_tokens,
                   "reply_audio_seconds": args.reply_audio_seconds, "packet_ms": getattr(args, "packet_ms", 20),
                   "levels": levels}
        Path(args.json_out).write_text(json.dumps(payload, indent=2))
    return 0 if all(level["failed_turns"] == 0 for level in levels) else 1
