"""One loaded pipeline as both Python APIs see it: the checkpoint's family and front end, the runtime."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from omnistage.config.pipeline import PipelineSpec, StageOverrides, apply_overrides, load_pipeline, load_preset
from omnistage.config.generation_defaults import sampling_defaults
from omnistage.core import Modality, OmniRequest, PromptDelta
from omnistage.families.base import FrontEnd, call_hook
from omnistage.families.registry import DEFAULT_REGISTRY, FamilyRegistry
from omnistage.pipeline.graph import resolve_graph
from omnistage.pipeline.reports import EngineStats, HealthReport
from omnistage.pipeline.request_state import OutputSink, TraceSink
from omnistage.pipeline.runtime import PipelineOptions, PipelineRuntime, model_factories
from omnistage.pipeline.serve_flags import PipelineConfig
from omnistage.processing.transcription import WordTimer


def preset_for(folder: Path, registry: FamilyRegistry = DEFAULT_REGISTRY) -> Path:
    """The stage preset a checkpoint is served with when no ``--stage-config`` is given (its family decides,
    from its typed config: e.g. a Qwen3-Omni Thinking checkpoint gets the thinker alone)."""
    family = registry.for_folder(folder)
    return family.preset(family.load_config(folder))


def load_word_timer(model: str | Path, registry: FamilyRegistry = DEFAULT_REGISTRY) -> WordTimer:
    """``serve --aligner``: the forced aligner a folder (or embedded name) holds, through its family's hook."""
    folder = registry.resolve_model(model)
    family = registry.for_folder(folder)
    if not family.hooks.word_timer:
        raise ValueError(f"--aligner {model}: a {family.name} checkpoint is no forced aligner (it times no words); "
                         "give a Qwen3-ForcedAligner checkpoint")
    return call_hook(family.hooks.word_timer, folder)  # type: ignore[return-value]


class OmniPipeline:
    """A started pipeline: a checkpoint's stage replicas behind one orchestrator, and its front end.

    The checkpoint's family is recognised from its config.json (through ``registry``), which parses its typed
    config once, picks the preset (unless a stage config is given) and resolves the stage config's names.
    """

    def __init__(self, model: str | Path = "tiny", stage_config: str | Path | PipelineSpec | None = None,
                 options: PipelineOptions | None = None, model_name: str | None = None,
                 overrides: StageOverrides | None = None, generation_config: str = "auto",
                 registry: FamilyRegistry = DEFAULT_REGISTRY, trace_sink: TraceSink | None = None,
                 aligner: str | Path | None = None) -> None:
        folder = registry.resolve_model(model)
        self.family = registry.for_folder(folder)
        config = self.family.load_config(folder)
        spec = _spec(stage_config) if stage_config is not None else load_preset(self.family.preset(config))
        self.spec = apply_overrides(spec, overrides or StageOverrides(), self.family.tensor_parallel_models)
        self.graph = resolve_graph(self.spec, self.family)  # a bad config fails here, before any process starts
        self.family.check_spec(self.spec, config)
        self.front_end: FrontEnd = self.family.front_end(folder, config)
        if aligner is not None:
            self.front_end = replace(self.front_end, word_timer=load_word_timer(aligner, registry))
        self.model_name = model_name or str(model)
        self.supports_audio = self.graph.supports_audio
        self.supports_text = self.graph.supports(Modality.TEXT)
        entry = self.spec.stage(self.graph.entry)
        self.max_model_len = entry.engine.model_len(self.front_end.max_positions)
        # The entry stage config's sampling, under the checkpoint's generation_config.json (vLLM's --generation-config).
        self.default_sampling = sampling_defaults(entry.sampling, folder, generation_config)
        options = (options or PipelineOptions()).for_model(str(model) in registry.embedded_names())
        self.runtime = PipelineRuntime(self.graph, model_factories(str(folder), self.graph, options),
                                       self.front_end.tokenizer, self.front_end.audio, options, trace_sink)

    @classmethod
    def from_config(cls, config: PipelineConfig, trace_sink: TraceSink | None = None) -> OmniPipeline:
        """``trace_sink``: where each finished request's trace goes when the server traces (None: it does not)."""
        return cls(config.model, config.stage_config, config.options, config.model_name, config.overrides,
                   config.generation_config, trace_sink=trace_sink, aligner=config.aligner)

    def submit(self, request: OmniRequest, sink: OutputSink) -> None:
        self.runtime.orchestrator.submit(request, sink)

    def abort(self, request_id: str) -> None:
        self.runtime.orchestrator.abort(request_id)

    def feed(self, request_id: str, delta: PromptDelta) -> None:
        self.runtime.orchestrator.feed(request_id, delta)

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
