"""One loaded pipeline as both Python APIs see it: the checkpoint's family and front end, the runtime."""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path

from omnistage.config.memory import parse_bytes
from omnistage.config.pipeline import (
    DTYPES,
    QUANTIZATIONS,
    PipelineSpec,
    StageOverrides,
    apply_overrides,
    load_pipeline,
    load_preset,
    per_stage,
)
from omnistage.config.generation_defaults import sampling_defaults
from omnistage.core import Modality, OmniRequest
from omnistage.families.base import FrontEnd
from omnistage.families.registry import DEFAULT_REGISTRY, FamilyRegistry
from omnistage.pipeline.connectors import CONNECTORS
from omnistage.pipeline.graph import resolve_graph
from omnistage.pipeline.liveness import DEFAULT_STALL_TIMEOUT_S
from omnistage.pipeline.reports import EngineStats, HealthReport
from omnistage.pipeline.request_state import OutputSink
from omnistage.pipeline.runtime import BACKENDS, PipelineOptions, PipelineRuntime, model_factories


def preset_for(folder: Path, registry: FamilyRegistry = DEFAULT_REGISTRY) -> str:
    """The stage preset a checkpoint is served with when no ``--stage-config`` is given (its family decides,
    from its typed config: e.g. a Qwen3-Omni Thinking checkpoint gets the thinker alone)."""
    family = registry.for_folder(folder)
    return family.preset(family.load_config(folder))


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
    group.add_argument("--talker-min-new-tokens", type=int, default=0,
                       help="frames the talker makes before it may stop (random-weight test checkpoints)")
    group.add_argument("--backend", choices=BACKENDS, default="local",
                       help="where stage replicas run: local processes (default) or Ray actors placed by each "
                            "stage's `placement` (docs/ray.md)")
    group.add_argument("--stage-stall-timeout", type=float, default=DEFAULT_STALL_TIMEOUT_S,
                       help="seconds a ready stage replica may go without progress (no output, no heartbeat from "
                            "its engine loop) before it is marked unhealthy, its requests fail, and it is killed and "
                            f"restarted (default {DEFAULT_STALL_TIMEOUT_S:g})")
    group.add_argument("--dtype", choices=DTYPES, default=None,
                       help="weights and activations of every stage (default: the stage config's; auto = "
                            "bfloat16 on CUDA, float32 on CPU; norms and RoPE compute in float32 either way)")
    group.add_argument("--kv-cache-memory", type=_kv_memory, default=(),
                       help="KV cache bytes per autoregressive stage, e.g. 2GiB, or per stage: thinker=2GiB,talker=1GiB "
                            "(instead of num_kv_blocks)")
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
    group.add_argument("--quantization", type=_quantization, default=(),
                       help=f"weight-only quantization of autoregressive stages ({'/'.join(QUANTIZATIONS)}), e.g. "
                            "int8, or per stage: thinker=int8 (FP8 checkpoints are recognised from their config)")
    group.add_argument("--ray-address", default=None,
                       help="the Ray cluster to join with --backend ray (default: the one started on this machine "
                            "by `ray start --head`, else a new local one)")


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


def overrides_from_args(args: argparse.Namespace) -> StageOverrides:
    return StageOverrides(dtype=getattr(args, "dtype", None) or "",
                          kv_cache_memory=tuple(getattr(args, "kv_cache_memory", ()) or ()),
                          gpu_memory_utilization=tuple(getattr(args, "gpu_memory_utilization", ()) or ()),
                          quantization=tuple(getattr(args, "quantization", ()) or ()),
                          tensor_parallel_size=int(getattr(args, "tensor_parallel_size", 0) or 0))


def options_from_args(args: argparse.Namespace) -> PipelineOptions:
    """The flags of :func:`add_pipeline_args` as options; ``ValueError`` names a bad combination."""
    return PipelineOptions(in_process=bool(getattr(args, "in_process", False)),
                           connector=getattr(args, "connector", None),
                           talker_min_new_tokens=int(getattr(args, "talker_min_new_tokens", 0) or 0),
                           backend=getattr(args, "backend", None) or "local",
                           ray_address=getattr(args, "ray_address", None),
                           stage_stall_timeout_s=float(getattr(args, "stage_stall_timeout", None)
                                                       or DEFAULT_STALL_TIMEOUT_S))


class OmniPipeline:
    """A started pipeline: a checkpoint's stage replicas behind one orchestrator, and its front end.

    The checkpoint's family is recognised from its config.json (through ``registry``), which parses its typed
    config once, picks the preset (unless a stage config is given) and resolves the stage config's names.
    """

    def __init__(self, model: str | Path = "tiny", stage_config: str | Path | PipelineSpec | None = None,
                 options: PipelineOptions | None = None, model_name: str | None = None,
                 overrides: StageOverrides | None = None, generation_config: str = "auto",
                 registry: FamilyRegistry = DEFAULT_REGISTRY) -> None:
        folder = registry.resolve_model(model)
        self.family = registry.for_folder(folder)
        config = self.family.load_config(folder)
        spec = _spec(stage_config) if stage_config is not None else load_preset(self.family.preset(config))
        self.spec = apply_overrides(spec, overrides or StageOverrides())
        self.graph = resolve_graph(self.spec, self.family)  # a bad config fails here, before any process starts
        self.family.check_spec(self.spec, config)
        self.front_end: FrontEnd = self.family.front_end(folder, config)
        self.model_name = model_name or str(model)
        self.processor = self.front_end.processor
        self.voices = self.front_end.voices
        self.speech = self.front_end.speech  # a TTS family's input preparation (None otherwise)
        self.supports_audio = self.graph.supports_audio
        self.supports_text = self.graph.supports(Modality.TEXT)
        entry = self.spec.stage(self.graph.entry)
        self.max_model_len = entry.engine.model_len(self.front_end.max_positions)
        # The entry stage config's sampling, under the checkpoint's generation_config.json (vLLM's --generation-config).
        self.default_sampling = sampling_defaults(entry.sampling, folder, generation_config)
        options = options or PipelineOptions()
        self.runtime = PipelineRuntime(self.graph, model_factories(str(folder), self.graph, options),
                                       self.front_end.tokenizer, self.front_end.num_code_groups, options)

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> OmniPipeline:
        names = getattr(args, "served_model_name", None) or ()
        return cls(getattr(args, "model", "tiny"), getattr(args, "stage_config", None), options_from_args(args),
                   names[0] if names else None, overrides_from_args(args),
                   getattr(args, "generation_config", None) or "auto")

    def submit(self, request: OmniRequest, sink: OutputSink) -> None:
        self.runtime.orchestrator.submit(request, sink)

    def abort(self, request_id: str) -> None:
        self.runtime.orchestrator.abort(request_id)

    def health(self) -> HealthReport:
        return self.runtime.orchestrator.health()

    def stats(self) -> EngineStats:
        stats = self.runtime.orchestrator.stats()
        store = self.runtime.store
        return replace(stats, shm_segments=store.live_segments()) if store is not None else stats

    def close(self) -> None:
        self.runtime.close()


def _spec(stage_config: str | Path | PipelineSpec) -> PipelineSpec:
    return stage_config if isinstance(stage_config, PipelineSpec) else load_pipeline(stage_config)
