"""The ``omnistage`` command: one sub-command per tool, each parsed here and run elsewhere."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from omnistage.entrypoints.openai.server_config import add_server_args


def _make_tiny(args: argparse.Namespace) -> int:
    """Dispatched through the family registry to the family's make-tiny hook."""
    from omnistage.families.base import call_hook
    from omnistage.families.registry import DEFAULT_REGISTRY

    return int(call_hook(DEFAULT_REGISTRY.family(args.model_type).hooks.make_tiny, args))


def _serve(args: argparse.Namespace) -> int:
    try:
        from omnistage.entrypoints.openai.api_server import run_server
    except ImportError as exc:
        print(f"omnistage serve: the OpenAI server cannot be loaded: {exc}", file=sys.stderr)
        return 3
    return run_server(args)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="omnistage", description="Serve Qwen3-Omni-style models.")
    sub = parser.add_subparsers(dest="command", required=True)

    tiny = sub.add_parser("make-tiny", help="write a random Qwen3-Omni checkpoint (offline): tiny, medium or slice")
    tiny.add_argument("out_dir", nargs="?", help="folder to write the checkpoint into")
    tiny.add_argument("--seed", type=int, default=0)
    tiny.add_argument("--size", choices=("tiny", "medium", "slice"), default="tiny",
                      help="tiny: toy widths (default); medium: the real codec layout, ~75M parameters; "
                           "slice: the real 30B-A3B widths with 2 decoder layers (~3.7 GB in bf16)")
    tiny.add_argument("--model-type", choices=("qwen3_omni", "qwen3_tts"), default="qwen3_omni",
                      help="the model family (qwen3_tts: Qwen3-TTS 12 Hz, sizes tiny and medium)")
    tiny.add_argument("--tts-model-type", choices=("custom_voice", "voice_design", "base"), default="custom_voice",
                      help="qwen3_tts only: named speakers, voice design, or voice cloning (Base)")
    tiny.add_argument("--cached", action="store_true",
                      help="make (if absent) the embedded model of --size (and type) under $OMNISTAGE_CACHE and print "
                           "its path")
    tiny.add_argument("--fp8", action="store_true",
                      help="write the checkpoint of --size with its thinker decoder in FP8, as NVIDIA ModelOpt "
                           "exports it (quantization_config quant_method modelopt, per-tensor scales)")
    tiny.add_argument("--confident-head", action="store_true",
                      help="qwen3_omni: a thinker whose greedy steps lead by a trained model's margins (median "
                           "top-1 minus top-2 of a few logits instead of ~0.15), for agreement measurements such "
                           "as bench quant's")
    tiny.set_defaults(func=_make_tiny)

    serve = sub.add_parser("serve", help="serve a model with an OpenAI-compatible API")
    serve.add_argument("--model", default="tiny",
                       help="checkpoint folder (its family is recognised from config.json), or an embedded random "
                            "checkpoint: tiny/medium/slice (Qwen3-Omni), tts-tiny/tts-medium[-design|-base] (Qwen3-TTS)")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8000)
    add_server_args(serve)
    from omnistage.pipeline.engine import add_pipeline_args

    add_pipeline_args(serve)
    serve.set_defaults(func=_serve)

    from omnistage.tools.bench import add_bench_parser
    from omnistage.tools.plan.cli import add_plan_parser
    from omnistage.tools.verify.cli import add_verify_parser

    add_bench_parser(sub)
    add_verify_parser(sub)
    add_plan_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
