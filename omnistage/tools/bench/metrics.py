"""What one streamed request did, and the figures a run reports (named as ``vllm bench serve --omni`` names them).

Times are ``time.perf_counter()`` seconds. A stream *underruns* when a player that started at its first audio
packet would run dry: at some packet's arrival, the audio received before it is shorter than the wall time
since the first packet.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from omnistage.audio.formats import PCM_RATE


@dataclass
class StreamRecord:
    """``rate``: its audio's samples per second (the API's PCM, or the served family's when in process)."""

    start: float
    rate: int = PCM_RATE
    first_token: float | None = None
    token_times: list[float] = field(default_factory=list)  # one entry per text token (a delta of n adds n)
    audio: list[tuple[float, int]] = field(default_factory=list)  # (arrival, samples) per audio packet
    end: float | None = None
    error: str | None = None

    def add_tokens(self, now: float, count: int) -> None:
        if count <= 0:
            return
        if self.first_token is None:
            self.first_token = now
        self.token_times.extend([now] * count)

    def add_audio(self, now: float, samples: int) -> None:
        if samples > 0:
            self.audio.append((now, samples))

    @property
    def ok(self) -> bool:
        return self.error is None and self.end is not None

    @property
    def ttft(self) -> float | None:
        return None if self.first_token is None else self.first_token - self.start

    @property
    def audio_ttfp(self) -> float | None:
        return self.audio[0][0] - self.start if self.audio else None

    @property
    def e2el(self) -> float:
        return (self.end or self.start) - self.start

    @property
    def num_tokens(self) -> int:
        return len(self.token_times)

    @property
    def tpot(self) -> float | None:
        """Mean time per output token after the first."""
        if self.num_tokens < 2 or self.first_token is None:
            return None
        return (self.token_times[-1] - self.first_token) / (self.num_tokens - 1)

    @property
    def itls(self) -> list[float]:
        """Gaps between text deliveries (tokens that arrived together count once)."""
        times = sorted(set(self.token_times))
        return [b - a for a, b in zip(times, times[1:])]

    @property
    def audio_seconds(self) -> float:
        return sum(n for _, n in self.audio) / self.rate

    @property
    def audio_rtf(self) -> float | None:
        """Wall seconds per audio second (end to end); below 1 is faster than real time."""
        return self.e2el / self.audio_seconds if self.audio_seconds > 0 else None

    def underrun_s(self) -> float:
        """The largest shortfall (s) a player starting at the first packet would see; 0 when it never runs dry."""
        if not self.audio:
            return 0.0
        first, received, worst = self.audio[0][0], 0.0, 0.0
        for now, samples in self.audio:
            worst = max(worst, (now - first) - received)
            received += samples / self.rate
        return worst


def _stats(name: str, values: list[float], scale: float = 1000.0) -> dict[str, float]:
    """mean/median/p50/p90/p99 of ``values`` in ms (``scale`` 1000) or as-is (``scale`` 1)."""
    if not values:
        return {}
    arr = np.asarray(values, dtype=np.float64) * scale
    unit = "_ms" if scale == 1000.0 else ""
    out = {f"mean_{name}{unit}": float(arr.mean()), f"median_{name}{unit}": float(np.median(arr))}
    for p in (50, 90, 99):
        out[f"p{p}_{name}{unit}"] = float(np.percentile(arr, p))
    return out


def summarize(records: list[StreamRecord], wall_s: float, underrun_tolerance_s: float = 0.0) -> dict[str, float]:
    """One concurrency level's figures. Latencies in ms; ``audio_throughput`` is audio seconds per wall second."""
    done = [r for r in records if r.ok]
    out: dict[str, float] = {"completed": len(done), "failed": len(records) - len(done), "duration_s": wall_s}
    out.update(_stats("ttft", [r.ttft for r in done if r.ttft is not None]))
    out.update(_stats("tpot", [r.tpot for r in done if r.tpot is not None]))
    out.update(_stats("itl", [x for r in done for x in r.itls]))
    out.update(_stats("e2el", [r.e2el for r in done]))
    out.update(_stats("audio_ttfp", [r.audio_ttfp for r in done if r.audio_ttfp is not None]))
    out.update(_stats("audio_rtf", [r.audio_rtf for r in done if r.audio_rtf is not None], scale=1.0))
    tokens = sum(r.num_tokens for r in done)
    audio = sum(r.audio_seconds for r in done)
    shortfalls = [r.underrun_s() for r in done if r.audio]
    out.update(
        total_output_tokens=tokens,
        output_throughput=tokens / wall_s if wall_s > 0 else 0.0,
        total_audio_s=audio,
        audio_throughput=audio / wall_s if wall_s > 0 else 0.0,
        audio_streams=len(shortfalls),
        underrun_streams=sum(1 for s in shortfalls if s > underrun_tolerance_s),
        max_underrun_ms=1000.0 * max(shortfalls, default=0.0),
        # A player that pauses to rebuffer stalls for exactly the shortfall in total: the mean is the stutter a
        # listener of this load hears, finer than the count of streams that stuttered at all.
        mean_underrun_ms=1000.0 * float(np.mean(shortfalls)) if shortfalls else 0.0,
        total_underrun_s=float(sum(shortfalls)),
    )
    return out
