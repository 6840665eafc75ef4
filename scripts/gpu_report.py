"""The one JSON that scripts/gpu_check.sh leaves under $OUT, written after every step so a killed run still leaves
what it had; and the in-process step budget (a step past its seconds is stopped and recorded as timed out).

No torch import here: the shell calls ``python3 scripts/gpu_report.py FILE step NAME RC SECONDS BUDGET`` after
each of its steps, and ``... FILE set KEY JSON`` for a value.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any


class StepTimeout(Exception):
    """A step ran past its budget."""


def read(path: str | Path) -> dict[str, Any]:
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return {}


def update(path: str | Path, **values: Any) -> None:
    """Merges ``values`` into the JSON at ``path`` (dicts one level deep), written whole and renamed into place."""
    report = read(path)
    for key, value in values.items():
        if isinstance(value, dict) and isinstance(report.get(key), dict):
            report[key] = {**report[key], **value}
        else:
            report[key] = value
    tmp = Path(f"{path}.tmp")
    tmp.write_text(json.dumps(report, indent=2, default=str))
    os.replace(tmp, path)


def _alarm(signum: int, frame: object) -> None:
    raise StepTimeout


@contextmanager
def step(path: str | Path, name: str, budget_s: int) -> Iterator[dict[str, Any]]:
    """Runs the body within ``budget_s`` seconds; records ``{status, seconds, budget_s, error}`` under
    ``steps.NAME`` and the body's figures (the yielded dict) under ``NAME``. A failure or a timeout is recorded
    and not raised: the next step still runs. ``status`` is ok, failed or timeout."""
    figures: dict[str, Any] = {}
    start = time.monotonic()
    print(f"--- {name} (budget {budget_s} s) [{time.strftime('%H:%M:%S')}]", flush=True)
    previous = signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(budget_s)
    status, error = "ok", ""
    try:
        yield figures
    except StepTimeout:
        status, error = "timeout", f"past its budget of {budget_s} s"
    except Exception as exc:  # noqa: BLE001 - recorded, and the next step runs
        status, error = "failed", f"{type(exc).__name__}: {exc}"
        traceback.print_exc()
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    seconds = round(time.monotonic() - start, 1)
    if figures.get("ok") is False and status == "ok":
        status, error = "failed", figures.get("error", "a check did not hold")
    print(f"--- {name}: {status} in {seconds} s{': ' + error if error else ''}", flush=True)
    update(path, **{name: figures, "steps": {name: {"status": status, "seconds": seconds, "budget_s": budget_s,
                                                     "error": error}}})


def main(argv: list[str]) -> int:
    path, verb = argv[0], argv[1]
    if verb == "step":  # FILE step NAME RC SECONDS BUDGET: the shell's record of one step's process
        name, rc, seconds, budget = argv[2], int(argv[3]), int(argv[4]), int(argv[5])
        status = "ok" if rc == 0 else "timeout" if rc in (124, 137) else "failed"
        known = read(path).get("steps", {}).get(name, {})
        entry = {"status": known.get("status", status) if rc == 0 else status, "seconds": seconds,
                 "budget_s": budget, "rc": rc}
        if rc != 0:
            entry["error"] = known.get("error") or f"exit status {rc}"
        update(path, steps={name: {**known, **entry}})
        return 0
    if verb == "set":  # FILE set KEY JSON
        update(path, **{argv[2]: json.loads(argv[3])})
        return 0
    raise SystemExit(f"unknown verb {verb!r}")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
