"""``omnistage make-tiny --model-type qwen2_5_omni``: the family's make-tiny hook, over both checkpoint makers (the
tiny, :mod:`make_tiny`; transformers' own init, :mod:`make_plain`, which builds on the tiny)."""

from __future__ import annotations

import argparse
import sys

from omnistage.families.qwen2_5_omni.make_plain import make_plain, parse_overrides
from omnistage.families.qwen2_5_omni.make_tiny import make_tiny, tiny_dir


def make_tiny_command(args: argparse.Namespace) -> int:
    """The family's ``make_tiny`` hook: ``omnistage make-tiny --model-type qwen2_5_omni [--cached] OUT``;
    ``--plain [--set KEY=VALUE ...]``: transformers' own init (:mod:`make_plain`), ``--seed`` its seed."""
    if getattr(args, "cached", False):
        print(tiny_dir(seed=args.seed))
        return 0
    if args.out_dir is None:
        print("make-tiny: give OUT_DIR or --cached", file=sys.stderr)
        return 2
    if getattr(args, "plain", False):
        print(make_plain(args.out_dir, seed=args.seed, overrides=parse_overrides(args.set or [])))
        return 0
    print(make_tiny(args.out_dir, seed=args.seed))
    return 0
