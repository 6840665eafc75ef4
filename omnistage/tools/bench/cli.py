"""Argument parsing for ``omnistage bench ...`` (heavy imports wait until a bench runs)."""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Callable

from omnistage.config.pipeline import KV_CACHE_DTYPES


def _lazy_main(module: str) -> Callable[[argparse.Namespace], int]:
    """``module.main`` imported when the bench runs, so ``omnistage --help`` stays fast (no torch import)."""

    def run(args: argparse.Namespace) -> int:
        return importlib.import_module(module).main(args)

    return run


# A stage replica gets cpu_count // replicas threads (one each for three stages on a small machine); a
# parallel region also stalls whenever another process holds one of its cores, so benches default to one.
MODEL_HELP = "checkpoint folder, or an embedded model name (tiny, medium, slice, tts-tiny...; default tiny)"
THREADS_HELP = "torch CPU threads (default 1, as a stage replica gets on a small machine)"


def _batches(text: str) -> list[int]:
    sizes = [int(x) for x in text.split(",") if x.strip()]
    if not sizes or min(sizes) < 1:
        raise argparse.ArgumentTypeError(f"--batch wants positive sizes like 1,4,16, got {text!r}")
    return sizes


def add_bench_parser(sub: argparse._SubParsersAction) -> None:
    bench = sub.add_parser("bench", help="throughput benchmarks")
    targets = bench.add_subparsers(dest="target", required=True)
    engine = targets.add_parser("engine", help="tokens/s of one stage engine at several batch sizes")
    engine.add_argument("--model", default="tiny", help=MODEL_HELP)
    engine.add_argument("--stage", default="thinker", choices=["thinker", "talker"], help="the stage engine to time")
    engine.add_argument("--batch", type=_batches, default=[1, 4, 16], help="comma-separated batch sizes")
    engine.add_argument("--prompt-len", type=int, default=16, help="prompt tokens per request (default 16)")
    engine.add_argument("--output-len", type=int, default=64, help="tokens generated per request (EOS ignored)")
    engine.add_argument("--repeats", type=int, default=2, help="runs per batch size; the best is reported")
    engine.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    engine.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"],
                        help="weights and activations (default float32)")
    engine.add_argument("--threads", type=int, default=1, help=THREADS_HELP)
    engine.add_argument("--temperature", type=float, default=0.0,
                        help="0: greedy (default); > 0 samples with --top-k, as the hotpath bench does (0.9, 50)")
    engine.add_argument("--top-k", type=int, default=50, help="top-k when --temperature > 0 (default 50)")
    engine.add_argument("--context-lens", type=_batches, default=None,
                        help="time the decode step instead at these context lengths (e.g. 32,2048): the batch's "
                             "requests grow from --prompt-len by decoding; JSON step_ms maps length -> ms")
    engine.add_argument("--steps", type=int, default=8, help="--context-lens: steps timed at each length (median)")
    engine.add_argument("--kv-cache-dtype", default="auto", choices=KV_CACHE_DTYPES,
                        help="--context-lens: what the KV cache stores (auto: the model's dtype)")
    engine.add_argument("--json", dest="json_out", default=None, help="also write the results as JSON here")
    engine.set_defaults(func=_engine_bench)
    add_roofline_parser(targets)
    add_quant_parser(targets)
    add_serve_parser(targets)
    add_realtime_parser(targets)
    add_duplex_parser(targets)
    add_speech_stream_parser(targets)


def add_duplex_parser(targets: argparse._SubParsersAction) -> None:
    duplex = targets.add_parser("duplex", help="N full-duplex sessions streaming speech in real time (Moshi)")
    duplex.add_argument("--model", default="moshi-tiny", help="a duplex checkpoint folder or embedded name "
                                                               "(moshi-tiny, moshi-medium, personaplex-tiny)")
    duplex.add_argument("--sessions", type=int, default=4, help="concurrent sessions (default 4)")
    duplex.add_argument("--seconds", type=float, default=20.0, help="how long they stream (default 20)")
    duplex.add_argument("--max-sessions", type=int, default=16,
                        help="rows the engine holds and calibrates up to (capacity is searched up to it)")
    duplex.add_argument("--budget", type=float, default=0.75, help="share of a frame a step may take (admission)")
    duplex.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1: a contended host "
                                                                "stalls a parallel region's barrier)")
    duplex.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"],
                        help="the model's weights and KV (the codec stays fp32)")
    duplex.add_argument("--json", dest="json_out", default=None, help="also write the report as JSON here")
    duplex.set_defaults(func=_lazy_main("omnistage.tools.bench.duplex"))


def _seconds(text: str) -> list[float]:
    values = [float(x) for x in text.split(",") if x.strip()]
    if not values or min(values) <= 0:
        raise argparse.ArgumentTypeError(f"--utterance-seconds wants positive lengths like 2,8,20, got {text!r}")
    return values


def add_realtime_parser(targets: argparse._SubParsersAction) -> None:
    rt = targets.add_parser("realtime", help="voice-agent latency: end of speech to first audio over WS /v1/realtime")
    rt.add_argument("--model", default="tiny", help=MODEL_HELP)
    rt.add_argument("--url", default=None, help="drive a running server (http://HOST:PORT); default: start "
                                               "`omnistage serve MODEL` for the run")
    rt.add_argument("--served-model-name", dest="served_model", default=None, help="with --url: the model id")
    rt.add_argument("--server-args", default="", help="extra `omnistage serve` flags for the started server")
    rt.add_argument("--concurrency", type=_batches, default=[1, 4], help="concurrent sessions per level")
    rt.add_argument("--utterance-seconds", type=_seconds, default=[2.0, 8.0, 20.0], help="user turn lengths")
    rt.add_argument("--turns", type=int, default=3, help="measured turns per session (default 3)")
    rt.add_argument("--reply-tokens", type=int, default=24, help="max_output_tokens of each reply (default 24)")
    rt.add_argument("--reply-audio-seconds", type=float, default=4.0,
                    help="audio heard of each reply before the client cancels it (default 4; 0: the whole reply, "
                         "which a random checkpoint's talker may make minutes long; a cancelled reply reports no "
                         "usage, so prefill tokens per turn need 0)")
    rt.add_argument("--streaming-input", choices=["on", "off", "both", "server"], default="both",
                    help="measure with the server's streaming input prefill, without it, or both alternating "
                         "(server: send no per-session option)")
    rt.add_argument("--start", choices=["staggered", "together"], default="staggered",
                    help="sessions' first turns spread evenly over a turn's cycle (default), or every turn of "
                         "every session at once (the worst case: each turn waits for every session's reply, so "
                         "the sessions' turns end together)")
    rt.add_argument("--barge-in", action=argparse.BooleanOptionalAction, default=True,
                    help="end each session with an interrupted reply (barge-in stop time)")
    rt.add_argument("--turn-detection", nargs="+", choices=["semantic", "server"], default=None,
                    help="measure turn detection instead of utterance lengths: each turn one sentence, most "
                         "with 300-700 ms pauses inside, under semantic_vad and/or server_vad (false starts, "
                         "cut-offs, the classifier's decisions)")
    rt.add_argument("--eagerness", choices=["low", "medium", "high", "auto"], default="auto",
                    help="semantic_vad's eagerness with --turn-detection semantic (default auto)")
    rt.add_argument("--packet-ms", type=int, default=20,
                    help="the microphone's packet: audio per input_audio_buffer.append (default 20, as WebRTC's Opus "
                         "frames; 100 was this bench's before, and delays when the server hears a pause by up to that)")
    rt.add_argument("--underrun-tolerance", type=float, default=0.0, help="shortfall (s) a stream may have")
    rt.add_argument("--json", dest="json_out", default=None, help="write the figures as JSON here")
    rt.set_defaults(func=_lazy_main("omnistage.tools.bench.realtime"))


def add_speech_stream_parser(targets: argparse._SubParsersAction) -> None:
    p = targets.add_parser("speech-stream", help="first audio and underruns of text spoken as an LLM writes it, "
                                                 "over WS /v1/audio/speech/stream")
    p.add_argument("--model", default="tts-tiny", help=MODEL_HELP.replace("default tiny", "default tts-tiny"))
    p.add_argument("--url", default=None, help="drive a running server (http://HOST:PORT); default: start "
                                               "`omnistage serve MODEL` for the run")
    p.add_argument("--served-model-name", dest="served_model", default=None, help="with --url: the model id")
    p.add_argument("--server-args", default="", help="extra `omnistage serve` flags for the started server")
    p.add_argument("--tokens-per-s", type=float, default=20.0, help="the writer's pace, LLM tokens a second")
    p.add_argument("--sessions", type=int, default=5, help="rounds of sessions, one after another (default 5)")
    p.add_argument("--concurrency", type=int, default=1, help="sessions at once in each round (default 1)")
    p.add_argument("--warmup", type=int, default=1, help="sessions before the measured ones (default 1)")
    p.add_argument("--voice", default="ryan", help="session.update's voice ('' for the server's default)")
    p.add_argument("--text", default=None, help="what the writer writes (default: a short spoken answer)")
    p.add_argument("--text-input", choices=["deltas", "sentences"], default=None,
                   help="ask the session for this mode (default: the server's, as session.created says)")
    p.add_argument("--audio-seconds", type=float, default=12.0,
                   help="each session cancels once it heard this much audio (default 12; 0: all of it, which a "
                        "random checkpoint's talker makes as long as its frame bound allows)")
    p.add_argument("--json", dest="json_out", default=None, help="write the figures as JSON here")
    p.set_defaults(func=_lazy_main("omnistage.tools.bench.speech_stream"))


def add_quant_parser(targets: argparse._SubParsersAction) -> None:
    quant = targets.add_parser("quant", help="thinker decode at batch 1 quantized vs unquantized, in one run")
    quant.add_argument("--model", default="tiny", help=MODEL_HELP)
    quant.add_argument("--quantization", default="int8", choices=["int8", "w8a8"],
                       help="the scheme compared with the unquantized stage (w8a8: --stage tts-talker only)")
    quant.add_argument("--stage", default="thinker", choices=["thinker", "tts-talker"],
                       help="tts-talker: Qwen3-TTS's talker and code predictor, codes compared per frame")
    quant.add_argument("--confident", action=argparse.BooleanOptionalAction, default=True,
                       help="tts-talker: give the random heads a trained model's margins first (default on)")
    quant.add_argument("--prompt-len", type=int, default=16, help="prompt tokens per request (default 16)")
    quant.add_argument("--output-len", type=int, default=64, help="greedy tokens (tts-talker: frames) compared "
                                                                  "and timed")
    quant.add_argument("--prompts", type=int, default=4, help="random prompts whose greedy replies are compared "
                                                              "(the first is also timed)")
    quant.add_argument("--repeats", type=int, default=2, help="runs of each; the best is reported")
    quant.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    quant.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"],
                        help="weights and activations (default float32)")
    quant.add_argument("--threads", type=int, default=1, help=THREADS_HELP)
    quant.add_argument("--json", dest="json_out", default=None, help="also write the results as JSON here")
    quant.set_defaults(func=_lazy_main("omnistage.tools.bench.quant"))


def add_roofline_parser(targets: argparse._SubParsersAction) -> None:
    roof = targets.add_parser("roofline", help="decode step time vs the bytes it must read at measured bandwidth")
    roof.add_argument("--model", default="tiny", help=MODEL_HELP)
    roof.add_argument("--stage", default="thinker",
                      choices=["thinker", "talker", "code2wav", "tts-talker", "tts-predictor"],
                      help="the stage whose decode step is timed (tts-predictor: Qwen3-TTS's code predictor alone)")
    roof.add_argument("--quantization", default="none", choices=["none", "int8", "w8a8"],
                      help="quantize the stage's decoder linears after loading, as serving's stage option "
                           "(w8a8: the Qwen3-TTS talker only)")
    roof.add_argument("--batch", type=_batches, default=[1, 16], help="comma-separated batch sizes")
    roof.add_argument("--steps", type=int, default=10, help="decode steps timed per batch (median reported)")
    roof.add_argument("--prompt-len", type=int, default=32, help="prompt tokens per request before decoding")
    roof.add_argument("--frames", type=int, default=50, help="code2wav: frames per chunk (25 new + 25 context)")
    roof.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    roof.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"],
                        help="weights and activations (default float32)")
    roof.add_argument("--threads", type=int, default=1, help=THREADS_HELP)
    roof.add_argument("--json", dest="json_out", default=None, help="also write the results as JSON here")
    roof.set_defaults(func=_lazy_main("omnistage.tools.bench.roofline"))


def _policies(text: str) -> list[str]:
    names = [x.strip() for x in text.split(",") if x.strip()]
    if not names or any(n not in ("fifo", "deadline") for n in names):
        raise argparse.ArgumentTypeError(f"--scheduling wants fifo and/or deadline, got {text!r}")
    return names


BACKENDS = {"openai-chat": "serve", "openai-audio-speech": "speech", "openai-audio-transcriptions": "transcription"}


def _engine_bench(args: argparse.Namespace) -> int:
    """``bench engine``: tokens/s by batch size (``engine.py``), or the decode step by context length
    (``context.py``, with ``--context-lens``)."""
    return _lazy_main(f"omnistage.tools.bench.{'context' if args.context_lens else 'engine'}")(args)


def _serve_backend(args: argparse.Namespace) -> int:
    """``bench serve`` by its backend: chat completions with audio (``serve.py``), speech (``speech.py``) or
    transcription (``transcription.py``)."""
    return _lazy_main(f"omnistage.tools.bench.{BACKENDS[args.backend]}")(args)


def add_serve_parser(targets: argparse._SubParsersAction) -> None:
    from omnistage.pipeline.serve_flags import add_model_args  # light: no torch

    serve = targets.add_parser("serve", help="streaming text+audio latency/throughput under bounded concurrency")
    serve.add_argument("--model", default="tiny", help=MODEL_HELP)
    serve.add_argument("--backend", default="openai-chat", choices=list(BACKENDS),
                       help="openai-chat: chat completions with text+audio (Qwen3-Omni); openai-audio-speech: "
                            "text-to-speech utterances (a TTS checkpoint; --random-input-len counts words); "
                            "openai-audio-transcriptions: clips of --audio-seconds written down (a Qwen3-ASR "
                            "checkpoint)")
    serve.add_argument("--audio-seconds", type=float, default=10.0,
                       help="openai-audio-transcriptions: seconds of each clip (default 10)")
    add_model_args(serve.add_argument_group("model (the in-process pipeline's, as serve's flags)"))
    serve.add_argument("--url", default=None,
                       help="drive a running server (http://HOST:PORT); default: start the pipeline in-process")
    serve.add_argument("--server-pid", type=int, default=None,
                       help="with --url: the server's process id; each level reports its CPU seconds (user + system, "
                            "not its stage replicas') per audio second")
    serve.add_argument("--served-model-name", "--served-model", dest="served_model", default=None,
                       help="model id the server answers to, as serve's --served-model-name (with --url; default "
                            "--model)")
    serve.add_argument("--stage-config", default=None, help="stage config YAML for the in-process pipeline")
    serve.add_argument("--concurrency", type=_batches, default=[1, 4, 16], help="comma-separated levels")
    serve.add_argument("--num-prompts", type=int, default=16, help="requests per concurrency level")
    serve.add_argument("--dataset-name", default="random", choices=["random"], help="as vllm bench serve")
    serve.add_argument("--random-input-len", type=int, default=32, help="prompt tokens (random dataset)")
    serve.add_argument("--output-tokens", type=int, default=100, help="text tokens per reply")
    serve.add_argument("--random-output-len", type=int, default=None, help="alias of --output-tokens (vllm name)")
    serve.add_argument("--ignore-eos", action=argparse.BooleanOptionalAction, default=True,
                       help="fixed lengths: generate exactly --output-tokens (in-process driver)")
    serve.add_argument("--audio-frames", type=int, default=None,
                       help="codec frames (the family's: 12.5 Hz for Qwen3-Omni) per reply, both sides "
                            "(default: = output tokens)")
    serve.add_argument("--initial-chunk-frames", type=int, default=None,
                       help="frames in the first code2wav chunk (default: chosen by load)")
    serve.add_argument("--scheduling", type=_policies, default=None,
                       help="fifo,deadline: run each policy on a fresh pipeline at the same load and compare")
    serve.add_argument("--code2wav-max-batch", type=int, default=None,
                       help="cap code2wav's batch (to make streams contend at small concurrency)")
    serve.add_argument("--baseline", choices=["none", "hf", "sequential", "reference", "pocket-tts"],
                       default="none",
                       help="hf: also run transformers' generate one request at a time and print ratios; "
                            "sequential (openai-audio-speech): the reference's one-at-a-time TTS generation; "
                            "reference (openai-audio-speech): the qwen-tts package's own generate, in its env; "
                            "pocket-tts (openai-audio-speech, a Pocket TTS checkpoint): Kyutai's pocket-tts package")
    serve.add_argument("--hf-num-prompts", type=int, default=None, help="baseline requests (default min(N, 4))")
    serve.add_argument("--warmup", type=int, default=1, help="requests run before measuring")
    serve.add_argument("--seed", type=int, default=0, help="seed of the random prompts and sampling (default 0)")
    serve.add_argument("--json", dest="json_out", default=None, help="write the figures as JSON here")
    serve.add_argument("--plot", default=None, help="write latency vs concurrency as a PNG (needs matplotlib)")
    serve.add_argument("--no-progress", action="store_true", help="no progress bar")
    serve.set_defaults(func=_serve_backend)
