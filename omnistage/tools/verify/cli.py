"""``omnistage verify``: parity of omnistage with transformers on one checkpoint.

:func:`add_verify_parser` is wired into ``omnistage.entrypoints.cli``, which runs the command (``omnistage verify``).
Exit status: 0 all cases match, 1 some case differs or a side fails to run, 2 no such model folder.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path

from omnistage.tools.verify.cases import CASE_NAMES, MAX_NEW_TOKENS, TALKER_MAX_NEW_TOKENS, TOLERANCE, TTS_CASE_NAMES


def add_verify_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    verify = subparsers.add_parser(
        "verify", help="compare omnistage with transformers on a checkpoint (greedy, fp32, CPU)",
        description="Runs transformers' Qwen3OmniMoeForConditionalGeneration and omnistage on the same prompts "
                    "(text, text+audio, text+image, text+video) and checks thinker tokens, prompt logits, talker codes and "
                    "the waveform. Needs only config.json and weights.")
    verify.add_argument("--model", default="tiny", help="checkpoint folder, or an embedded model name (tiny, medium, "
                                                        "slice, tts-tiny...; default tiny)")
    verify.add_argument("--json", nargs="?", const="-", metavar="FILE",
                        help="also write a JSON report to FILE (stdout when FILE is omitted; the table then "
                             "goes to stderr)")
    verify.add_argument("--case", action="append", choices=CASE_NAMES + TTS_CASE_NAMES,
                        help="run only this case (repeatable)")
    # transformers needs two thinker tokens to build a talker prompt and two talker steps for one frame.
    verify.add_argument("--max-new-tokens", type=_at_least_two, default=MAX_NEW_TOKENS,
                        help=f"thinker tokens (default {MAX_NEW_TOKENS})")
    verify.add_argument("--talker-max-new-tokens", type=_at_least_two, default=TALKER_MAX_NEW_TOKENS,
                        help="talker steps (frames = steps - 1, as in transformers)")
    verify.add_argument("--tolerance", type=float, default=TOLERANCE, help="bound on logits and waveform diffs")
    verify.add_argument("--tensor-parallel-size", type=_positive, default=1,
                        help="shard omnistage's thinker over this many processes (gloo on CPU)")
    verify.set_defaults(func=run_verify_command)
    return verify


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _at_least_two(text: str) -> int:
    value = int(text)
    if value < 2:
        raise argparse.ArgumentTypeError(f"must be at least 2, got {value}")
    return value


def run_verify_command(args: argparse.Namespace) -> int:
    """Dispatched through the family registry to the checkpoint's family's verify hook."""
    from omnistage.families.base import call_hook
    from omnistage.families.registry import DEFAULT_REGISTRY
    from omnistage.usage_error import UsageError

    folder = DEFAULT_REGISTRY.resolve_model(args.model)  # a missing folder or unknown family: one line, exit 2
    family = DEFAULT_REGISTRY.for_folder(folder)
    if not family.hooks.verify:
        raise UsageError(f"the {family.name} family has no parity check")
    return int(call_hook(family.hooks.verify, args, folder))


def run_omni_verify(args: argparse.Namespace, folder: Path) -> int:
    """Qwen3-Omni's ``verify`` hook: transformers' Qwen3OmniMoeForConditionalGeneration vs omnistage."""
    from omnistage.families.qwen3_omni.offline import GenerationSettings
    from omnistage.tools.verify.compare import format_table, run_verify
    from omnistage.tools.verify.output import write_json

    if args.case and not set(args.case) <= set(CASE_NAMES):
        print(f"omnistage verify: a Qwen3-Omni checkpoint has the cases {', '.join(CASE_NAMES)}", file=sys.stderr)
        return 2
    defaults = GenerationSettings()
    settings = replace(defaults, max_new_tokens=args.max_new_tokens,
                       talker_max_new_tokens=args.talker_max_new_tokens,
                       talker_min_new_tokens=min(defaults.talker_min_new_tokens, args.talker_max_new_tokens))
    try:
        report = run_verify(folder, settings=settings, cases=args.case, tolerance=args.tolerance,
                            tensor_parallel_size=args.tensor_parallel_size)
    except Exception as exc:  # noqa: BLE001 - a checkpoint either side cannot run is a failed verification
        message = f"{type(exc).__name__}: {exc}"
        print(f"omnistage verify: {message}", file=sys.stderr)
        write_json(args.json, json.dumps({"model": str(folder), "ok": False, "error": message, "cases": []}))
        return 1
    print(format_table(report), file=sys.stderr if args.json == "-" else sys.stdout)
    write_json(args.json, report.dumps())
    return 0 if report.ok else 1

