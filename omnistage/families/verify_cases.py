"""What a family's ``verify`` hook reports: each case's largest difference against the reference and its bound
(or why it did not run), printed as a table and, with ``--json``, as one JSON report; exit 0 when every case that
ran holds (Pocket TTS's and Higgs Audio v2's hooks)."""

from __future__ import annotations

import argparse
import json
import sys
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
    """The largest difference of two tensors (inf when their shapes differ)."""
    if a.shape != b.shape:
        return float("inf")
    return float((a.float() - b.float()).abs().max()) if a.numel() else 0.0


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
