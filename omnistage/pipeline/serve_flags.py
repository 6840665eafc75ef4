"""The pipeline's ``omnistage serve`` flags and the :class:`PipelineConfig` they are read into, once.

Light on purpose (no torch, no zmq): the CLI parses and checks every flag, and claims its port, before the
pipeline's heavy modules load.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from omnistage.config.memory import parse_bytes
from omnistage.config.pipeline import (
    DTYPES, KV_CACHE_DTYPES, QUANTIZATIONS, PipelineSpec, StageOverrides, load_pipeline, per_stage,
)
from omnistage.pipeline.liveness import DEFAULT_STALL_TIMEOUT_S, DEFAULT_STEP_TIMEOUT_S
from omnistage.pipeline.options import (
    BACKENDS, CONNECTORS, DEFAULT_STREAM_INTERVAL_MS, EMBEDDED_MIN_FRAMES, PipelineOptions,
)


def add_pipeline_args(parser: argparse.ArgumentParser) -> None:
    """The pipeline's flags for ``omnistage serve`` (what ``AsyncOmni.from_args`` reads)."""
    group = parser.add_argument_group("pipeline")
    group.add_argument("--stage-config", default=None,
                       help="stage config YAML (default: the preset the checkpoint's family picks from its "
                            "config.json: qwen3_omni, qwen3_omni_thinking for a checkpoint without a talker, "
                            "qwen3_tts for a Qwen3-TTS checkpoint)")
    group.add_argument("--in-process", action="store_true",
                       help="run every stage replica as a thread of the server process (debugging)")
    group.add_argument("--connector", choices=CONNECTORS, default=None,
                       help="how tensors cross stages (default: shm for processes, inproc for threads)")
    group.add_argument("--talker-min-new-tokens", type=int, default=None,
                       help="frames the talker makes before it may stop (default: "
                            f"{EMBEDDED_MIN_FRAMES} for an embedded random checkpoint such as tiny, whose "
                            "talker would otherwise stop at its first frame in about one reply in 40; 0 for a "
                            "checkpoint folder)")
    group.add_argument("--backend", choices=BACKENDS, default="local",
                       help="where stage replicas run: local processes (default) or Ray actors placed by each "
                            "stage's `placement` (docs/ray.md)")
    group.add_argument("--stage-stall-timeout", type=float, default=DEFAULT_STALL_TIMEOUT_S,
                       help="seconds a ready stage replica may go silent (no output, no heartbeat: stopped or "
                            "gone) before it is marked unhealthy, its requests fail, and it is killed and restarted "
                            f"(default {DEFAULT_STALL_TIMEOUT_S:g})")
    group.add_argument("--stage-step-timeout", type=float, default=DEFAULT_STEP_TIMEOUT_S,
                       help="seconds one engine step of a stage replica may run (its heartbeats going on) before it "
                            "is taken for hung and handled as a stall; raise it for very long prefills on slow "
                            f"hosts (default {DEFAULT_STEP_TIMEOUT_S:g})")
    group.add_argument("--stream-interval-ms", type=float, default=DEFAULT_STREAM_INTERVAL_MS,
                       help="a request's new tokens leave its stage at most this often, merged into one delta (its "
                            "first and last at once), as do a talker's frame notices (merged) and a replica's load "
                            "when nothing else goes: fewer, larger messages when steps are fast, for less server "
                            f"CPU; 0 sends every step's (default {DEFAULT_STREAM_INTERVAL_MS:g})")
    group.add_argument("--stage-ready-timeout", type=float, default=PipelineOptions.ready_timeout_s,
                       help="seconds the stage replicas may take to load and warm up before start-up fails; raise "
                            "it for large checkpoints on a slow or busy host "
                            f"(default {PipelineOptions.ready_timeout_s:g})")
    add_model_args(group)
    group.add_argument("--gpu-memory-utilization", type=_utilization, default=(),
                       help="CUDA: fraction of the device each autoregressive stage may use (weights, activations "
                            "and KV), e.g. 0.45, or per stage: thinker=0.5,talker=0.3")
    group.add_argument("--generation-config", default="auto",
                       help="sampling defaults of requests that leave a knob unset: auto (the checkpoint's "
                            "generation_config.json over the stage config's), vllm (the stage config's only), or a "
                            "folder holding a generation_config.json")
    group.add_argument("--tensor-parallel-size", type=int, default=0,
                       help="shard the thinker over this many processes (CUDA: one GPU each, from the stage's "
                            "device on; CPU: gloo); default: the stage config's tensor_parallel_size")
    group.add_argument("--max-model-len", type=_per_stage_int, default=(),
                       help="tokens of one request's context (prompt and output) in each autoregressive stage, "
                            "e.g. 4096, or per stage: thinker=8192,talker=4096 (default: the stage config's, else "
                            "the model's own limit); also what the API checks prompts against")
    group.add_argument("--max-num-seqs", type=_per_stage_int, default=(),
                       help="requests a stage replica runs at once, e.g. 16, or per stage: thinker=32,code2wav=8 "
                            "(default: the stage config's)")
    group.add_argument("--aligner", default=None, metavar="ALIGNER_DIR",
                       help="a forced-aligner checkpoint (Qwen3-ForcedAligner) served beside the model: "
                            "/v1/audio/transcriptions then gives timestamp_granularities=['word'] and verbose_json "
                            "words")
    group.add_argument("--transcription-model", default=None, metavar="ASR_DIR",
                       help="a speech recogniser (Qwen3-ASR) served beside the model, in a pipeline of its own "
                            "under the same request bound: /v1/models lists it, /v1/audio/transcriptions takes it "
                            "when `model` names it, and a realtime session's input transcription when "
                            "`transcription.model` does (the model answers the turns it writes down)")
    group.add_argument("--transcription-served-model-name", default=None, metavar="NAME",
                       help="the id the --transcription-model is listed and named by (default: as given)")
    group.add_argument("--ray-address", default=None,
                       help="the Ray cluster to join with --backend ray (default: the one started on this machine "
                            "by `ray start --head`, else a new local one)")


def add_model_args(group: argparse._ArgumentGroup | argparse.ArgumentParser) -> None:
    """How the model is loaded (``--dtype``, ``--kv-cache-memory``, ``--kv-cache-dtype``, ``--quantization``):
    ``serve``'s, and every ``bench serve`` backend's for its in-process pipeline."""
    group.add_argument("--dtype", choices=DTYPES, default=None,
                       help="weights and activations of every stage (default: the stage config's; auto = "
                            "bfloat16 on CUDA, float32 on CPU; norms and RoPE compute in float32 either way)")
    group.add_argument("--kv-cache-memory", type=_kv_memory, default=(),
                       help="KV cache bytes per autoregressive stage, e.g. 2GiB, or per stage: thinker=2GiB,talker=1GiB "
                            "(default on a CPU: 4 GiB, at most half the available memory and num_kv_blocks blocks, as vLLM's "
                            "CPU backend; on CUDA num_kv_blocks)")
    group.add_argument("--kv-cache-dtype", choices=KV_CACHE_DTYPES, default=None,
                       help="what every autoregressive stage's KV cache stores (default: the stage config's; auto = "
                            "the model's dtype); bfloat16 halves a float32 CPU stage's cache, as vLLM's flag")
    group.add_argument("--quantization", type=_quantization, default=(),
                       help=f"quantization of autoregressive stages ({'/'.join(QUANTIZATIONS)}; int8 weight-only, "
                            "w8a8 the Qwen3-TTS talker's int8 weights with int8 activations on CPU), e.g. int8, or "
                            "per stage: thinker=int8 (FP8 checkpoints are recognised from their config)")


def model_overrides(args: argparse.Namespace) -> StageOverrides:
    """:func:`add_model_args`' flags alone as stage overrides (what ``bench serve`` takes of serve's flags)."""
    return StageOverrides(dtype=args.dtype or "", kv_cache_dtype=args.kv_cache_dtype or "",
                          kv_cache_memory=tuple(args.kv_cache_memory), quantization=tuple(args.quantization))


def _kv_memory(text: str) -> tuple[tuple[str, object], ...]:
    try:
        return per_stage(text, parse_bytes)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _quantization(text: str) -> tuple[tuple[str, object], ...]:
    try:
        return per_stage(text, str)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _utilization(text: str) -> tuple[tuple[str, object], ...]:
    try:
        return per_stage(text, float)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _per_stage_int(text: str) -> tuple[tuple[str, object], ...]:
    try:
        pairs = per_stage(text, int)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{exc} (want a whole number, or per stage: thinker=4096)") from None
    if any(value < 1 for _, value in pairs):
        raise argparse.ArgumentTypeError(f"must be at least 1, got {text!r}")
    return pairs


@dataclass(frozen=True)
class PipelineConfig:
    """What to serve and how, as ``omnistage serve`` was asked: built once from the flags
    (:func:`pipeline_config_from_args`), read by :meth:`OmniPipeline.from_config`."""

    model: str = "tiny"
    stage_config: PipelineSpec | None = None  # --stage-config, parsed (and checked) when the flags are read
    options: PipelineOptions = PipelineOptions()
    overrides: StageOverrides = StageOverrides()
    generation_config: str = "auto"
    model_name: str | None = None  # the id the API answers to (default: ``model``)
    aligner: str | None = None  # --aligner: a forced aligner's folder (or embedded name), loaded beside the model
    transcription_model: str | None = None  # --transcription-model: a recogniser served beside, its own pipeline
    transcription_model_name: str | None = None  # --transcription-served-model-name (default: as given)

    def recogniser(self) -> PipelineConfig | None:
        """The pipeline of ``--transcription-model`` (its family's preset, this one's runtime options), or None."""
        if self.transcription_model is None:
            return None
        return PipelineConfig(model=self.transcription_model, options=self.options,
                              model_name=self.transcription_model_name or self.transcription_model)


def overrides_from_args(args: argparse.Namespace) -> StageOverrides:
    return StageOverrides(dtype=args.dtype or "", kv_cache_dtype=args.kv_cache_dtype or "",
                          kv_cache_memory=tuple(args.kv_cache_memory),
                          gpu_memory_utilization=tuple(args.gpu_memory_utilization),
                          quantization=tuple(args.quantization), tensor_parallel_size=args.tensor_parallel_size,
                          max_model_len=tuple(args.max_model_len), max_num_seqs=tuple(args.max_num_seqs))


def options_from_args(args: argparse.Namespace) -> PipelineOptions:
    """The flags of :func:`add_pipeline_args` as options; ``ValueError`` names a bad combination."""
    return PipelineOptions(in_process=args.in_process, connector=args.connector,
                           talker_min_new_tokens=args.talker_min_new_tokens, backend=args.backend,
                           ray_address=args.ray_address, stage_stall_timeout_s=args.stage_stall_timeout,
                           stage_step_timeout_s=args.stage_step_timeout, ready_timeout_s=args.stage_ready_timeout,
                           stream_interval_ms=args.stream_interval_ms)


def pipeline_config_from_args(args: argparse.Namespace, model: str, model_name: str | None) -> PipelineConfig:
    """The pipeline flags (:func:`add_pipeline_args`) read once; ``ValueError`` names a bad combination
    (``ConfigError``, a subclass, a bad stage config field)."""
    spec = load_pipeline(args.stage_config) if args.stage_config else None  # a bad YAML is said before loading
    return PipelineConfig(model=model, stage_config=spec, options=options_from_args(args),
                          overrides=overrides_from_args(args), generation_config=args.generation_config,
                          model_name=model_name, aligner=getattr(args, "aligner", None),
                          transcription_model=getattr(args, "transcription_model", None),
                          transcription_model_name=getattr(args, "transcription_served_model_name", None))
