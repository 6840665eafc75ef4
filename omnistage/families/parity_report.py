"""What a TTS family's ``omnistage verify`` hook reports: named cases, each its largest difference against the
reference and its bound (or why it did not run), as a table and, with ``--json``, one JSON report; exit status 0
when every case that ran holds. Pocket TTS's, CSM's and Higgs Audio v2's hooks share it."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch


@dataclass(frozen=True)
class CaseResult:
    name: str
    max_abs_diff: float
    tolerance: float
    skipped: str = ""  # why the case did not run ("": it ran)

    @property
    def ok(self) -> bool:
        return bool(self.skipped) or self.max_abs_diff <= self.tolerance


def max_abs_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    """inf for different shapes (a case that made another length than its reference differs)."""
    if a.shape != b.shape:
        return float("inf")
    return float((a.float() - b.float()).abs().max()) if a.numel() else 0.0


def verify_command(args: argparse.Namespace, folder: Path, run: Callable[[Path, int, float], list[CaseResult]],
                   frames: int, tolerance: float) -> int:
    """Runs ``run(folder, frames, tolerance)`` (``--talker-max-new-tokens`` and ``--tolerance`` override the
    defaults given) and reports it."""
    if getattr(args, "tolerance", None) is not None:
        tolerance = args.tolerance
    try:
        results = run(folder, getattr(args, "talker_max_new_tokens", None) or frames, max(tolerance, 0.0))
    except Exception as exc:  # noqa: BLE001 - a side that cannot run is a failed verification
        print(f"omnistage verify: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    return report_cases(args, folder, results)


def report_cases(args: argparse.Namespace, folder: Path, results: list[CaseResult]) -> int:
    report = {"model": str(folder), "ok": all(r.ok for r in results),
              "cases": [{**asdict(r), "ok": r.ok} for r in results]}
    table = "\n".join(f"{r.name:12s} " + (f"skipped: {r.skipped}" if r.skipped else
                                          f"max|diff| {r.max_abs_diff:.3g} (<= {r.tolerance:.3g}) "
                                          f"{'ok' if r.ok else 'DIFFERS'}") for r in results)
    print(table, file=sys.stderr if args.json == "-" else sys.stdout)
    if args.json == "-":
        print(json.dumps(report))
    elif args.json:
        Path(args.json).write_text(json.dumps(report) + "\n")
    return 0 if report["ok"] else 1
