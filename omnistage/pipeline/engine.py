"""One loaded pipeline as both Python APIs see it: checkpoint facts, the prompt processor, the runtime."""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass, replace
from pathlib import Path

from omnistage.config.memory import parse_bytes
from omnistage.config.pipeline import (
    DTYPES,
    QUANTIZATIONS,
    ConfigError,
    PipelineSpec,
    StageOverrides,
    apply_overrides,
    load_pipeline,
    load_preset,
    per_stage,
)
from omnistage.config.generation_defaults import sampling_defaults
from omnistage.core import OmniRequest
from omnistage.entrypoints.openai.engine_protocol import EngineStats, HealthReport
from omnistage.pipeline.connectors import CONNECTORS
from omnistage.pipeline.liveness import DEFAULT_STALL_TIMEOUT_S
from omnistage.pipeline.request_state import OutputSink
from omnistage.pipeline.runtime import BACKENDS, PipelineOptions, PipelineRuntime, model_factories
from omnistage.pipeline.topology import topology_of
from omnistage.processing.prompt import PromptProcessor

PRESET = "qwen3_omni"  # Instruct: thinker → talker → code2wav
TEXT_ONLY_PRESET = "qwen3_omni_thinking"  # Thinking (no talker): the thinker alone


def has_talker(config: dict) -> bool:
    """Whether a checkpoint speaks: transformers builds talker + code2wav only when ``enable_audio_output``
    is true, and the Thinking checkpoints ship neither the weights nor (some) the ``talker_config``."""
    return bool(config.get("enable_audio_output", True)) and "talker_config" in config


def preset_for(folder: Path) -> str:
    """The stage preset a checkpoint is served with when no ``--stage-config`` is given."""
    return PRESET if has_talker(json.loads((folder / "config.json").read_text())) else TEXT_ONLY_PRESET


@dataclass(frozen=True)
class CheckpointFacts:
    """What the front end needs from ``config.json`` without loading any weights."""

    voices: tuple[str, ...]
    num_code_groups: int
    max_positions: int

    @classmethod
    def read(cls, folder: Path) -> CheckpointFacts:
        config = json.loads((folder / "config.json").read_text())
        talker = config.get("talker_config") or {}
        # Names as the checkpoint spells them (lookups are case-insensitive).
        voices = tuple(name[:1].upper() + name[1:] for name in (talker.get("speaker_id") or {}))
        positions = int(config["thinker_config"]["text_config"].get("max_position_embeddings", 32768))
        return cls(voices, int(talker.get("num_code_groups", 16)), positions)


def add_pipeline_args(parser: argparse.ArgumentParser) -> None:
    """The pipeline's flags for ``omnistage serve`` (what ``AsyncOmni.from_args`` reads)."""
    group = parser.add_argument_group("pipeline")
    group.add_argument("--stage-config", default=None, help=f"stage config YAML (default: the {PRESET} preset, or "
                       f"{TEXT_ONLY_PRESET} for a checkpoint without a talker)")
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
    """A started pipeline: the thinker → talker → code2wav replicas behind one orchestrator."""

    def __init__(self, model: str | Path = "tiny", stage_config: str | Path | PipelineSpec | None = None,
                 options: PipelineOptions | None = None, model_name: str | None = None,
                 overrides: StageOverrides | None = None, generation_config: str = "auto") -> None:
        from omnistage.tools.make_tiny import resolve_model

        folder = resolve_model(str(model))
        self.spec = apply_overrides(_spec(stage_config, folder), overrides or StageOverrides())
        topology = topology_of(self.spec)  # a bad config fails here, before any process starts
        if topology.supports_audio and preset_for(folder) == TEXT_ONLY_PRESET:
            raise ConfigError(f"{folder} has no talker (a Thinking/text-only checkpoint) but the stage config has "
                              f"talker/code2wav stages; use the {TEXT_ONLY_PRESET} preset")
        facts = CheckpointFacts.read(folder)
        self.model_name = model_name or str(model)
        self.processor = PromptProcessor.from_folder(folder)
        self.voices = facts.voices
        self.supports_audio = topology.supports_audio
        thinker = self.spec.stage(topology.thinker).engine
        self.max_model_len = thinker.model_len(facts.max_positions)
        self.default_sampling = sampling_defaults(self.spec.stage(topology.thinker).sampling, folder,
                                                  generation_config)
        options = options or PipelineOptions()
        self.runtime = PipelineRuntime(self.spec, model_factories(str(folder), self.spec, options),
                                       self.processor.tokenizer, facts.num_code_groups, options)

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


def _spec(stage_config: str | Path | PipelineSpec | None, folder: Path | None = None) -> PipelineSpec:
    """The given stage config, else the preset for ``folder``'s checkpoint (the Instruct one without a folder)."""
    if isinstance(stage_config, PipelineSpec):
        return stage_config
    if stage_config is not None:
        return load_pipeline(stage_config)
    return load_preset(PRESET if folder is None else preset_for(folder))
