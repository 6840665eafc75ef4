"""``omnistage make-tiny --model-type qwen3_asr`` (``--size tiny|full|full-1.7b``, ``--aligner``,
``--layout hf|published``) and ``--model-type qwen3_forced_aligner``: the family's make-tiny hook."""

from __future__ import annotations

import argparse
import sys

from omnistage.families.qwen3_asr.make_tiny import make_tiny, tiny_dir
from omnistage.families.qwen3_asr.sizes import SIZES


def make_tiny_command(args: argparse.Namespace) -> int:
    aligner = args.model_type == "qwen3_forced_aligner"
    if getattr(args, "cached", False):
        if args.size != "tiny":
            print("make-tiny --cached: Qwen3-ASR embeds only --size tiny", file=sys.stderr)
            return 2
        print(tiny_dir(seed=args.seed, aligner=aligner))
        return 0
    if args.out_dir is None:
        print("make-tiny: give OUT_DIR or --cached", file=sys.stderr)
        return 2
    layout = getattr(args, "layout", None) or "hf"
    print(make_tiny(args.out_dir, seed=args.seed, size=SIZES[args.size], aligner=aligner, layout=layout))
    return 0
