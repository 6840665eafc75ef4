"""Argument parsing for ``omnistage bench ...`` (heavy imports wait until a bench runs)."""

from __future__ import annotations

import argparse


def _batches(text: str) -> list[int]:
    sizes = [int(x) for x in text.split(",") if x.strip()]
    if not sizes or min(sizes) < 1:
        raise argparse.ArgumentTypeError(f"--batch wants positive sizes like 1,4,16, got {text!r}")
    return sizes


def _run_engine(args: argparse.Namespace) -> int:
    from omnistage.tools.bench.engine import main

    return main(args)


def add_bench_parser(sub: argparse._SubParsersAction) -> None:
    bench = sub.add_parser("bench", help="throughput benchmarks")
    targets = bench.add_subparsers(dest="target", required=True)
    engine = targets.add_parser("engine", help="tokens/s of one stage engine at several batch sizes")
    engine.add_argument("--model", default="tiny", help="checkpoint folder, or 'tiny' for the embedded model")
    engine.add_argument("--stage", default="thinker", choices=["thinker", "talker"])
    engine.add_argument("--batch", type=_batches, default=[1, 4, 16], help="comma-separated batch sizes")
    engine.add_argument("--prompt-len", type=int, default=16)
    engine.add_argument("--output-len", type=int, default=64, help="tokens generated per request (EOS ignored)")
    engine.add_argument("--repeats", type=int, default=2, help="runs per batch size; the best is reported")
    engine.add_argument("--device", default="cpu")
    engine.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    engine.add_argument("--json", dest="json_out", default=None, help="also write the results as JSON here")
    engine.set_defaults(func=_run_engine)
