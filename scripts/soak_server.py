"""The server under soak, for ``soak.py``: started (and stopped) by the soak, its processes' memory, and what its
/metrics says (a histogram's p99, the gauges that must be back to zero)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

API_KEY = "soak-key"
OTHER_KEY = "soak-key-2"  # a second tenant: what API_KEY stores, it may not read (soak_probes_bounds.py)
SEND_TIMEOUT_S = 5.0  # the server this script starts uses these; a --url server should too
HEADER_TIMEOUT_S = 5.0


def replica_stage(pid: int) -> str | None:
    """The stage a replica process serves, from its command line (``... replica_process ... --stage talker``);
    None for any other process."""
    args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    if b"omnistage.pipeline.replica_process" not in args or b"--stage" not in args:
        return None
    return args[args.index(b"--stage") + 1].decode()


def rss_by_process(pid: int) -> dict[str, int]:
    """RSS (KiB) of ``pid`` ("api") and each of its descendants ("talker PID" for a stage replica), from /proc."""
    out: dict[str, int] = {}
    todo = [pid]
    while todo:
        p = todo.pop()
        try:
            rss = next(int(line.split()[1]) for line in Path(f"/proc/{p}/status").read_text().splitlines()
                       if line.startswith("VmRSS:"))
            name = "api" if p == pid else (replica_stage(p) or "other")
            out[name if p == pid else f"{name} {p}"] = rss
            for task in Path(f"/proc/{p}/task").iterdir():
                todo += [int(c) for c in (task / "children").read_text().split()]
        except (FileNotFoundError, ProcessLookupError, StopIteration):
            continue
    return out


def histogram(url: str, name: str) -> dict[float, float]:
    """A /metrics histogram's cumulative counts by upper bound (all label sets summed); empty without it."""
    text = httpx.get(f"{url}/metrics", timeout=10, headers={"Authorization": f"Bearer {API_KEY}"}).text
    buckets: dict[float, float] = {}
    for line in text.splitlines():
        if line.startswith(f"{name}_bucket") and 'le="' in line:
            bound = float(line.split('le="', 1)[1].split('"', 1)[0])
            buckets[bound] = buckets.get(bound, 0.0) + float(line.rsplit(" ", 1)[1])
    return buckets


def p99(before: dict[float, float], after: dict[float, float]) -> float | None:
    """The bucket bound under which 99% of the observations between two snapshots fell."""
    delta = sorted((bound, count - before.get(bound, 0.0)) for bound, count in after.items())
    total = delta[-1][1] if delta else 0.0
    return next((bound for bound, count in delta if count >= 0.99 * total), None) if total else None


def leftovers(url: str) -> dict[str, float]:
    """Non-zero KV / queue / running / shm gauges from /metrics."""
    text = httpx.get(f"{url}/metrics", timeout=10, headers={"Authorization": f"Bearer {API_KEY}"}).text
    out = {}
    for line in text.splitlines():
        if line.startswith(("omnistage_kv_blocks_used", "omnistage_queue_depth", "omnistage_requests_running",
                            "omnistage_shm_segments")):
            name, value = line.rsplit(" ", 1)
            if float(value):
                out[name] = float(value)
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(model: str, *extra: str) -> tuple[subprocess.Popen, str]:
    port = free_port()
    exe = Path(sys.executable).with_name("omnistage")
    proc = subprocess.Popen([str(exe), "serve", model, "--port", str(port), "--talker-min-new-tokens", "8",
                             "--api-key", API_KEY, "--api-key", OTHER_KEY, "--send-timeout", str(SEND_TIMEOUT_S),
                             "--header-timeout", str(HEADER_TIMEOUT_S), *extra],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        if proc.poll() is not None:
            raise SystemExit(f"the server exited with {proc.returncode}")
        time.sleep(1)
    raise SystemExit("the server did not become healthy")


def start_voices_server(folder: Path) -> tuple[subprocess.Popen, str]:
    """A tiny Qwen3-TTS Base server (it clones voices), so the voice-upload probe reaches the audio decoding."""
    exe = Path(sys.executable).with_name("omnistage")
    made = subprocess.run([str(exe), "make-tiny", "--model-type", "qwen3_tts", "--tts-model-type", "base",
                           "--cached"], check=True, capture_output=True, text=True)
    return start_server(made.stdout.strip().splitlines()[-1], "--voices-dir", str(folder))


def stop(proc: subprocess.Popen) -> None:
    os.killpg(proc.pid, signal.SIGINT)
    try:
        proc.wait(60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)


def _quarters(series: list[tuple[float, float]], warmup_s: float, at: float) -> tuple[float, float]:
    """The ``at`` quantile, in MiB, of the first and of the last quarter after warm-up."""
    steady = [kib for t, kib in series if t >= warmup_s] or [kib for _, kib in series]
    quarter = max(len(steady) // 4, 1)

    def quantile(values: list[float]) -> float:
        return sorted(values)[min(int(at * len(values)), len(values) - 1)] / 1024

    return (quantile(steady[:quarter]), quantile(steady[-quarter:])) if steady else (0.0, 0.0)


# Growth is judged on each quarter's floor (its 10th percentile), the median beside it. The API process holds
# request bodies while they arrive and are parsed (a hundred 200 MB bodies trickle all hour, 60 MB media come and
# go: 0.8 to 2.3 GiB within minutes), so its quarter's median moves with where they fell: -3.3% in one hour,
# +11.9% in the next, its floor +0.8% and +1.9%. A leak raises the floor; a body in flight does not. (The median
# was chosen over the mean for the same reason: a few samples during a 60 MB parse moved the mean ~100 MiB.)
FLOOR, MEDIAN = 0.1, 0.5


def memory_figures(samples: list[tuple[float, dict[str, int]]], warmup_s: float) -> dict[str, object]:
    """RSS over the run, summed and per process: "flat" compares the last quarter's floor with the first's after
    warm-up (``FLOOR``; each quarter's median too).
    A process that appears or goes during the run (a replica replaced after the SIGSTOP) is reported with its
    own span, and its figures are not mixed into another's; one that came up during the run warms up from its own
    start (``warm_from_s``), as the first processes did from the run's."""
    totals = [(t, sum(by.values())) for t, by in samples]
    first, last = _quarters(totals, warmup_s, FLOOR)
    per_process: dict[str, dict[str, float]] = {}
    for name in dict.fromkeys(n for _, by in samples for n in by):
        series = [(t, by[name]) for t, by in samples if name in by]
        warm_from = warmup_s if series[0][0] <= warmup_s else series[0][0] + warmup_s
        a, b = _quarters(series, warm_from, FLOOR)
        median = _quarters(series, warm_from, MEDIAN)
        per_process[name] = {"from_s": round(series[0][0]), "to_s": round(series[-1][0]),
                             "warm_from_s": round(warm_from),
                             "first_quarter_mib": round(a, 1), "last_quarter_mib": round(b, 1),
                             "growth_mib": round(b - a, 1), "median_mib": [round(m, 1) for m in median],
                             "max_mib": round(max(k for _, k in series) / 1024, 1)}
    return {"rss_mib_first_quarter": round(first, 1), "rss_mib_last_quarter": round(last, 1),
            "rss_growth_mib": round(last - first, 1), "rss_per_process": per_process,
            "rss_mib_min_max": [round(min(k for _, k in totals) / 1024, 1),
                                round(max(k for _, k in totals) / 1024, 1)] if totals else None,
            "rss_timeline_mib": [[round(t), round(sum(by.values()) / 1024, 1),
                                  {n: round(k / 1024, 1) for n, k in by.items()}] for t, by in samples]}
