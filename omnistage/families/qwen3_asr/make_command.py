"""``omnistage make-tiny --model-type qwen3_asr`` (``--size tiny|full|full-1.7b``, ``--aligner``,
``--layout transformers|published``) and ``--model-type qwen3_forced_aligner``: the family's make-tiny hook."""

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
    layout = {None: "hf", "transformers": "hf", "published": "published"}.get(getattr(args, "layout", None))
    if layout is None:
        print(f"make-tiny: --layout {args.layout}: a Qwen3-ASR checkpoint is written in transformers' layout or "
              "Qwen's published one", file=sys.stderr)
        return 2
    print(make_tiny(args.out_dir, seed=args.seed, size=SIZES[args.size], aligner=aligner, layout=layout))
    return 0
