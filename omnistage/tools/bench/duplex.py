"""``omnistage bench duplex``: N duplex sessions streaming speech at real-time pace for S seconds.

The checkpoint's family gives the duplex engine its model and codec (its ``duplex`` hook); the engine is
calibrated (a step with the codec around it at 1, 2, 4, ... sessions), then N sessions open and a feeder thread
hands each its next frame of speech samples every 80 ms, each on its own phase, while the engine ticks on the
wall clock (each tick: Mimi encodes every user frame, Moshi steps, Mimi decodes every agent frame). Every agent frame's lateness (when it went
out, from its tick's start) is recorded; a frame sent as silence because its step missed the deadline is a late
frame; a stream underruns when a frame reaches its player after the frame before it finished playing (the
player starts one frame after the first arrives). Reported: lateness p50/p99, ``late_frames``,
``underrun_streams``, input frames filled with silence, step time against sessions (calibrated, and as run), and
the largest N whose step fits the admission budget (``capacity``).
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from dataclasses import asdict, dataclass, field

import numpy as np
import torch

from omnistage.engine.duplex.admission import calibrate
from omnistage.engine.duplex.engine import DuplexEngine, SessionRefused
from omnistage.engine.duplex.session import AgentFrame, DuplexSession


@dataclass
class Player:
    """A session's client: when each agent frame arrived, and whether playback ever ran dry."""

    frame_s: float
    arrivals: list[float] = field(default_factory=list)

    def on_frame(self, frame: AgentFrame) -> None:
        self.arrivals.append(time.monotonic())

    def underruns(self) -> int:
        if not self.arrivals:
            return 0
        start = self.arrivals[0] + self.frame_s  # one frame buffered before playing
        return sum(t > start + i * self.frame_s for i, t in enumerate(self.arrivals))


@dataclass(frozen=True)
class DuplexReport:
    model: str
    sessions: int
    seconds: float
    threads: int
    dtype: str
    frames_out: int
    late_frames: int
    underrun_streams: int
    filled_input_frames: int
    lateness_ms_p50: float
    lateness_ms_p99: float
    step_ms_p50: float
    step_ms_p99: float
    step_ms_by_sessions: dict[int, float]
    capacity: int
    budget: float
    refused: str
    codec: str = "Mimi inside each step: every session's user frame encoded and agent frame decoded, streamed"


def feed(sessions: list[DuplexSession], tracks: list[torch.Tensor], frame_s: float, stop: threading.Event) -> None:
    """Each session's next frame every ``frame_s``, session k on a phase of k / N of a frame."""
    start, n = time.monotonic(), len(sessions)
    if n == 0:
        return
    due = [start + k * frame_s / n for k in range(n)]
    sent = [0] * n
    while not stop.is_set():
        k = min(range(n), key=due.__getitem__)
        stop.wait(max(0.0, due[k] - time.monotonic()))
        if sent[k] < len(tracks[k]):
            sessions[k].hear(tracks[k][sent[k]])
        sent[k] += 1
        due[k] += frame_s


def run_bench(args: argparse.Namespace) -> DuplexReport:
    from omnistage.families.base import call_hook
    from omnistage.families.registry import DEFAULT_REGISTRY
    from omnistage.tools.bench.duplex_speech import user_tracks

    folder = DEFAULT_REGISTRY.resolve_model(args.model)
    family = DEFAULT_REGISTRY.for_folder(folder)
    if not family.hooks.duplex:
        raise SystemExit(f"bench duplex: the {family.name} family is not a duplex model")
    served = call_hook(family.hooks.duplex, folder, max(args.sessions, args.max_sessions), args.dtype)
    model, codec = served.model, served.codec
    times = calibrate(model, codec=codec)
    engine = DuplexEngine(model, times, budget=args.budget, codec=codec)
    capacity = engine.admission.capacity()
    if codec is None:
        raise SystemExit("bench duplex: the model has no codec to hear speech through")
    tracks = user_tracks(args.sessions, args.seconds + 1, codec.samples_per_frame)
    players = [Player(model.frame_s) for _ in range(args.sessions)]
    sessions, refused = [], ""
    for p in players:
        try:
            sessions.append(engine.open(p.on_frame))
        except SessionRefused as e:
            refused = str(e)
            break
    return _timed(engine, sessions, players[:len(sessions)], tracks, args, times.seconds.copy(), capacity, refused)


def _timed(engine: DuplexEngine, sessions: list[DuplexSession], players: list[Player], tracks: list[torch.Tensor],
           args: argparse.Namespace, calibrated: dict[int, float], capacity: int, refused: str) -> DuplexReport:
    stop = threading.Event()
    feeder = threading.Thread(target=feed, args=(sessions, tracks, engine.model.frame_s, stop), daemon=True)
    engine.start()
    feeder.start()
    time.sleep(args.seconds)
    stop.set()
    engine.stop()
    feeder.join()
    lateness = np.array([x for s in sessions for x in s.stats.lateness_s]) * 1e3
    steps = np.array([r.step_s for r in engine.reports if r.rows]) * 1e3
    pct = lambda a, q: round(float(np.percentile(a, q)), 2) if len(a) else 0.0  # noqa: E731
    return DuplexReport(
        str(args.model), len(sessions), args.seconds, torch.get_num_threads(), args.dtype,
        sum(s.stats.frames_out for s in sessions), sum(s.stats.late_frames for s in sessions),
        sum(p.underruns() > 0 for p in players), sum(s.stats.filled_frames for s in sessions),
        pct(lateness, 50), pct(lateness, 99), pct(steps, 50), pct(steps, 99),
        {n: round(t * 1e3, 2) for n, t in calibrated.items()}, capacity, args.budget, refused)


def main(args: argparse.Namespace) -> int:
    torch.set_num_threads(args.threads)
    report = run_bench(args)
    text = json.dumps(asdict(report), indent=2)
    print(text)
    if args.json_out:
        with open(args.json_out, "w") as f:
            f.write(text + "\n")
    print(f"largest N holding real time (step within {args.budget:.0%} of the frame): {report.capacity}",
          file=sys.stderr)
    return 0 if report.late_frames == 0 and report.underrun_streams == 0 and not report.refused else 1
