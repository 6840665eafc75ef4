"""The ``omnistage`` command: one sub-command per tool, each parsed here and run elsewhere.

As vLLM's CLI: ``omnistage serve [MODEL]``, ``--version``, ``--log-level`` on every sub-command, no abbreviated
flags (``--prot`` is an error, not ``--protect-metrics``), and each sub-command's own usage on its errors. A known
mistake ends in one ``omnistage: error: ...`` line with exit code 2 (:mod:`omnistage.entrypoints.cli_errors`).
"""

from __future__ import annotations

import argparse
import logging
import sys
import traceback
from collections.abc import Iterator, Sequence

from omnistage import __version__
from omnistage.entrypoints.serve_config import LOG_LEVELS, ServeConfig


def _embedded_names() -> str:
    """The built-in random checkpoints' names, from the registry's data (no family is imported)."""
    from omnistage.families.registry import DEFAULT_REGISTRY

    return ", ".join(DEFAULT_REGISTRY.embedded_names())


def _make_tiny(args: argparse.Namespace) -> int:
    """Dispatched through the family registry to the family's make-tiny hook."""
    from omnistage.families.base import call_hook
    from omnistage.families.registry import DEFAULT_REGISTRY
    from omnistage.usage_error import UsageError

    sizes = DEFAULT_REGISTRY.sizes()[args.model_type]
    if args.size not in sizes:
        raise UsageError(f"--model-type {args.model_type} comes in --size {', '.join(sizes)}, not {args.size}")
    return int(call_hook(DEFAULT_REGISTRY.family(args.model_type).hooks.make_tiny, args))


def _serve(args: argparse.Namespace) -> int:
    from omnistage.entrypoints.listen_socket import bind_socket

    config = ServeConfig.from_args(args)  # every flag read once, checked before anything loads
    with bind_socket(config.host, config.port) as sock:  # a port in use is said now, not after loading
        from omnistage.entrypoints.openai.serve_command import run_server

        return run_server(config, sock)


def _add_make_tiny(sub: argparse._SubParsersAction) -> None:
    from omnistage.families.registry import DEFAULT_REGISTRY

    tiny = sub.add_parser("make-tiny", help="write a random checkpoint (offline): tiny, medium or slice",
                          description="Writes a random checkpoint in the Hugging Face layout (config.json, "
                                      "safetensors, tokenizer, processor configs) that transformers loads.")
    tiny.add_argument("out_dir", nargs="?", help="folder to write the checkpoint into")
    tiny.add_argument("--seed", type=int, default=0, help="seed of the random weights (default 0)")
    sizes = DEFAULT_REGISTRY.sizes()
    tiny.add_argument("--size", choices=tuple(dict.fromkeys(s for f in sizes.values() for s in f)), default="tiny",
                      help="tiny: toy widths (default); medium: realistic widths for measurements (qwen3_omni: the "
                           "real codec layout, ~75M parameters); slice: the real 30B-A3B widths with 2 decoder "
                           "layers (~3.7 GB in bf16). Per family: "
                           + "; ".join(f"{name}: {', '.join(s)}" for name, s in sizes.items()))
    tiny.add_argument("--model-type", choices=DEFAULT_REGISTRY.names, default=DEFAULT_REGISTRY.names[0],
                      help=f"the model family (default {DEFAULT_REGISTRY.names[0]})")
    tiny.add_argument("--tts-model-type", choices=("custom_voice", "voice_design", "base"), default="custom_voice",
                      help="qwen3_tts only: named speakers, voice design, or voice cloning (Base)")
    tiny.add_argument("--layout", choices=("transformers", "published", "personaplex"), default=None,
                      help="the checkpoint's layout: transformers' (default); qwen3_asr: published, as Qwen's release "
                           "lays it out (qwen-asr's); moshi: personaplex, Kyutai's with PersonaPlex's 16-step depth "
                           "decoder")
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
    tiny.add_argument("--plain", action="store_true",
                      help="qwen2_5_omni: the tiny's config with transformers' own random init under --seed (no "
                           "confident heads), beside the tiny's tokenizer, processor and speakers")
    tiny.add_argument("--set", action="append", metavar="KEY=VALUE",
                      help="with --plain: change a config.json entry first, by dotted path (repeatable), e.g. "
                           "talker_config.num_hidden_layers=3")
    tiny.set_defaults(func=_make_tiny)


def _add_serve(sub: argparse._SubParsersAction) -> None:
    from omnistage.entrypoints.openai.server_config import add_server_args
    from omnistage.pipeline.serve_flags import add_pipeline_args
    from omnistage.tracing.options import add_tracing_args

    serve = sub.add_parser("serve", help="serve a model with an OpenAI-compatible API",
                           usage="%(prog)s [MODEL] [options]",
                           description="Serves a checkpoint with an OpenAI-compatible API (chat completions with "
                                       "audio, speech, realtime). Example: omnistage serve tiny --port 8001")
    serve.add_argument("model_tag", nargs="?", metavar="MODEL",
                       help="checkpoint folder or embedded model name, as vLLM's `serve MODEL` (same as --model; "
                            "default tiny)")
    serve.add_argument("--model", default=None,
                       help=f"checkpoint folder (its family is recognised from config.json), or an embedded random "
                            f"checkpoint, made offline on first use: {_embedded_names()} (default tiny)")
    serve.add_argument("--host", default="127.0.0.1",
                       help="address to listen on (default 127.0.0.1, this machine only; 0.0.0.0 for every "
                            "interface: see README, Exposing the server)")
    serve.add_argument("--port", type=int, default=8000, help="TCP port to listen on (default 8000)")
    add_server_args(serve)
    add_pipeline_args(serve)
    add_tracing_args(serve)
    serve.set_defaults(func=_serve)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="omnistage", allow_abbrev=False,
                                     description="Serve omni and speech models (Qwen3-Omni, Qwen3-TTS) with an "
                                                 "OpenAI-compatible API, on a CPU or a GPU.")
    parser.add_argument("--version", action="version", version=f"omnistage {__version__}",
                        help="print the version and exit")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _add_make_tiny(sub)
    _add_serve(sub)
    from omnistage.tools.bench import add_bench_parser
    from omnistage.tools.plan.cli import add_plan_parser
    from omnistage.tools.verify.cli import add_verify_parser

    add_bench_parser(sub)
    add_verify_parser(sub)
    add_plan_parser(sub)
    for command in _commands(parser):
        command.allow_abbrev = False  # --prot must not silently mean --protect-metrics
        command.add_argument("--log-level", choices=LOG_LEVELS, default="info",
                             help="how much to log (default info); debug also prints the traceback of errors")
        command.set_defaults(command_parser=command)
    return parser


def _commands(parser: argparse.ArgumentParser) -> Iterator[argparse.ArgumentParser]:
    """Every parser that runs a command (the leaves: ``serve``, ``bench serve``...)."""
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        yield parser
    for action in subs:
        for child in dict.fromkeys(action.choices.values()):  # aliases map to the same parser
            yield from _commands(child)


def parse_args(parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> argparse.Namespace:
    """As ``parse_args``, but a stray argument is reported with its sub-command's usage, not the top level's."""
    args, extra = parser.parse_known_args(argv)
    if extra:
        args.command_parser.error(f"unrecognized arguments: {' '.join(extra)}")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parse_args(parser, argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(levelname)s %(name)s: %(message)s")
    return run_command(args)


def run_command(args: argparse.Namespace) -> int:
    """Runs the parsed command; a known mistake becomes one line and exit code 2 (with its traceback at debug)."""
    from omnistage.entrypoints.cli_errors import EXIT_USAGE, explain

    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        return 130
    except Exception as exc:
        message = explain(exc)
        if message is None:
            raise
        if args.log_level == "debug":
            traceback.print_exc()
        print(f"omnistage: error: {message}", file=sys.stderr)
        return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
