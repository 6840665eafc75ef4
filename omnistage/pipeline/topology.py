"""Which stage of a stage config plays which part, checked before anything starts.

The config loader checks each field; this checks the pipeline as a whole:
every stage runs a known model with the right engine kind, each model runs in
one stage (more capacity is ``replicas``), each edge names a known transform
between the stages that transform connects. Errors name the offending field.
"""

from __future__ import annotations

from dataclasses import dataclass

from omnistage.config.pipeline import ConfigError, PipelineSpec

# Stage model → the engine kind it needs.
STAGE_MODELS = {"thinker": "ar", "talker": "ar", "code2wav": "generation"}
# Edge transform → (source model, target model).
TRANSFORMS = {
    "qwen3_omni.thinker_to_talker": ("thinker", "talker"),
    "qwen3_omni.talker_to_code2wav": ("talker", "code2wav"),
}


@dataclass(frozen=True)
class Topology:
    """Stage names by role; ``talker``/``code2wav`` are None in a text-only pipeline."""

    thinker: str
    talker: str | None = None
    code2wav: str | None = None

    @property
    def supports_audio(self) -> bool:
        return self.talker is not None and self.code2wav is not None


def _check_stages(spec: PipelineSpec) -> dict[str, str]:
    by_model: dict[str, str] = {}
    for i, stage in enumerate(spec.stages):
        if stage.model not in STAGE_MODELS:
            raise ConfigError(f"stages[{i}].model: unknown stage model {stage.model!r} "
                              f"(known: {', '.join(STAGE_MODELS)})")
        if stage.kind != STAGE_MODELS[stage.model]:
            raise ConfigError(f"stages[{i}].kind: model {stage.model!r} runs on a {STAGE_MODELS[stage.model]!r} "
                              f"engine, not {stage.kind!r}")
        if stage.model in by_model:
            raise ConfigError(f"stages[{i}].model: a second {stage.model!r} stage (use replicas for more capacity)")
        by_model[stage.model] = stage.name
    if "thinker" not in by_model:
        raise ConfigError("stages: no stage runs model 'thinker' (the pipeline's entry)")
    return by_model


def _check_edges(spec: PipelineSpec, by_model: dict[str, str]) -> set[tuple[str, str]]:
    model_of = {s.name: s.model for s in spec.stages}
    linked: set[tuple[str, str]] = set()
    for i, edge in enumerate(spec.edges):
        if edge.transform not in TRANSFORMS:
            raise ConfigError(f"edges[{i}].transform: unknown transform {edge.transform!r} "
                              f"(known: {', '.join(TRANSFORMS)})")
        source, target = TRANSFORMS[edge.transform]
        if model_of[edge.source] != source:
            raise ConfigError(f"edges[{i}].from: {edge.transform} reads a {source!r} stage, "
                              f"not {edge.source!r} ({model_of[edge.source]})")
        if model_of[edge.target] != target:
            raise ConfigError(f"edges[{i}].to: {edge.transform} feeds a {target!r} stage, "
                              f"not {edge.target!r} ({model_of[edge.target]})")
        linked.add((source, target))
    return linked


def topology_of(spec: PipelineSpec) -> Topology:
    by_model = _check_stages(spec)
    linked = _check_edges(spec, by_model)
    index = {s.name: i for i, s in enumerate(spec.stages)}
    for source, target in (("thinker", "talker"), ("talker", "code2wav")):
        if target in by_model and (source, target) not in linked:
            raise ConfigError(f"stages[{index[by_model[target]]}]: stage {by_model[target]!r} has no edge "
                              f"from a {source!r} stage")
    if "talker" in by_model and "code2wav" not in by_model:
        raise ConfigError("stages: a 'talker' stage needs a 'code2wav' stage to turn its codes into audio")
    return Topology(by_model["thinker"], by_model.get("talker"), by_model.get("code2wav"))
