"""``omnistage verify`` on a Qwen3-TTS folder (detected from config.json by ``omnistage.tools.verify.cli``).

Uses the same flags: ``--talker-max-new-tokens`` (talker steps; frames = steps - 1), ``--case``, ``--tolerance``,
``--json``. Exit status as for Qwen3-Omni: 0 every case matches, 1 a case differs or a side cannot run.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from omnistage.tools.verify.output import write_json
from omnistage.tools.verify.tts_compare import TTS_CASE_NAMES, format_tts_table, run_tts_verify

__all__ = ["TTS_CASE_NAMES", "run_tts_verify_command"]


def run_tts_verify_command(args: argparse.Namespace, folder: Path) -> int:
    """Qwen3-TTS's ``verify`` hook."""
    cases = [c for c in args.case or [] if c in TTS_CASE_NAMES] or None
    if args.case and cases is None:
        print(f"omnistage verify: a Qwen3-TTS checkpoint has the cases {', '.join(TTS_CASE_NAMES)}", file=sys.stderr)
        return 2
    try:
        report = run_tts_verify(folder, max_new_tokens=args.talker_max_new_tokens, cases=cases,
                                tolerance=args.tolerance)
    except Exception as exc:  # noqa: BLE001 - a side that cannot run is a failed verification
        message = f"{type(exc).__name__}: {exc}"
        print(f"omnistage verify: {message}", file=sys.stderr)
        write_json(args.json, json.dumps({"model": str(folder), "ok": False, "error": message, "cases": []}))
        return 1
    print(format_tts_table(report), file=sys.stderr if args.json == "-" else sys.stdout)
    write_json(args.json, report.dumps())
    return 0 if report.ok else 1
