"""A stage config resolved through its model family: which code each stage runs, and how requests flow.

The config loader checks each field; this checks the pipeline as a whole and
resolves its names: each stage's ``model:`` through the family's stage models
(the engine kind must match; a model runs in one stage, more capacity is
``replicas``), each edge's ``transform:`` through the family's edges (between
the stage models it joins). Exactly one stage has no incoming edge: the entry
stage, where requests start. Every stage must lead to an output the caller gets
(text or audio). Errors name the offending field.
"""

from __future__ import annotations

from dataclasses import dataclass

from omnistage.config.pipeline import ConfigError, PipelineSpec, StageSpec
from omnistage.core import Modality
from omnistage.families.base import EdgeModel, Family, StageModel


@dataclass(frozen=True)
class Edge:
    source: str  # stage names
    target: str
    model: EdgeModel
    name: str  # the transform's name

    @property
    def is_codec(self) -> bool:
        return self.model.make is None


@dataclass(frozen=True)
class StageGraph:
    spec: PipelineSpec
    family: Family
    models: dict[str, StageModel]  # stage name → what its model: resolved to
    edges: tuple[Edge, ...]
    entry: str

    def stage(self, name: str) -> StageSpec:
        return self.spec.stage(name)

    def edges_from(self, stage: str) -> list[Edge]:
        return [e for e in self.edges if e.source == stage]

    def output_stage(self, modality: Modality) -> str | None:
        return next((name for name, m in self.models.items() if m.output is modality), None)

    def supports(self, modality: Modality) -> bool:
        return self.output_stage(modality) is not None

    @property
    def supports_audio(self) -> bool:
        return self.supports(Modality.AUDIO)

    def stages_for(self, modalities: frozenset[Modality]) -> frozenset[str]:
        """The stages a request wanting ``modalities`` runs through: every stage on the way to their outputs."""
        needed: set[str] = set()
        for modality in modalities:
            stage = self.output_stage(modality)
            while stage is not None and stage not in needed:
                needed.add(stage)
                stage = next((e.source for e in self.edges if e.target == stage), None)
        return frozenset(needed)

    def codec_edge(self) -> Edge | None:
        return next((e for e in self.edges if e.is_codec), None)


def _resolve_stages(spec: PipelineSpec, family: Family) -> dict[str, StageModel]:
    models: dict[str, StageModel] = {}
    seen: set[str] = set()
    for i, stage in enumerate(spec.stages):
        model = family.stage_models.get(stage.model)
        if model is None:
            raise ConfigError(f"stages[{i}].model: {family.name} has no stage model {stage.model!r} "
                              f"(known: {', '.join(family.stage_models)})")
        if stage.kind != model.kind:
            raise ConfigError(f"stages[{i}].kind: model {stage.model!r} runs on a {model.kind!r} engine, "
                              f"not {stage.kind!r}")
        if stage.tensor_parallel_size > 1 and not model.tensor_parallel:
            shardable = ", ".join(family.tensor_parallel_models) or "no"
            raise ConfigError(f"stages[{i}].tensor_parallel_size: tensor parallelism is implemented for "
                              f"{family.name}'s {shardable} stages only")
        if stage.model in seen:
            raise ConfigError(f"stages[{i}].model: a second {stage.model!r} stage (use replicas for more capacity)")
        seen.add(stage.model)
        models[stage.name] = model
    return models


def _resolve_edges(spec: PipelineSpec, family: Family) -> tuple[Edge, ...]:
    model_of = {s.name: s.model for s in spec.stages}
    edges = []
    for i, edge in enumerate(spec.edges):
        model = family.edges.get(edge.transform)
        if model is None:
            raise ConfigError(f"edges[{i}].transform: {family.name} has no transform {edge.transform!r} "
                              f"(known: {', '.join(family.edges)})")
        for end, stage, wanted in (("from", edge.source, model.source), ("to", edge.target, model.target)):
            if model_of[stage] != wanted:
                verb = "reads" if end == "from" else "feeds"
                raise ConfigError(f"edges[{i}].{end}: {edge.transform} {verb} a {wanted!r} stage, "
                                  f"not {stage!r} ({model_of[stage]})")
        edges.append(Edge(edge.source, edge.target, model, edge.transform))
    return tuple(edges)


def _entry(spec: PipelineSpec, edges: tuple[Edge, ...], models: dict[str, StageModel], family: Family) -> str:
    """The one stage without an incoming edge, whose model must be one that can start a request."""
    index = {s.name: i for i, s in enumerate(spec.stages)}
    for edge in edges:
        if sum(1 for e in edges if e.target == edge.target) > 1:
            raise ConfigError(f"stages[{index[edge.target]}]: stage {edge.target!r} has more than one incoming edge")
    entries = [s for s in spec.stages if not any(e.target == s.name for e in edges)]
    if len(entries) > 1:
        raise ConfigError(f"stages[{index[entries[1].name]}]: stage {entries[1].name!r} has no incoming edge (only "
                          f"the entry stage, {entries[0].name!r}, may have none)")
    if not entries:
        raise ConfigError("edges: every stage has an incoming edge: no stage to start requests at")
    entry = entries[0]
    if not models[entry.name].entry:
        starters = [name for name, m in family.stage_models.items() if m.entry]
        raise ConfigError(f"stages[{index[entry.name]}].model: {entry.model!r} cannot start a request (the "
                          f"entry stage runs {' or '.join(map(repr, starters))})")
    return entry.name


def resolve_graph(spec: PipelineSpec, family: Family) -> StageGraph:
    models = _resolve_stages(spec, family)
    edges = _resolve_edges(spec, family)
    graph = StageGraph(spec, family, models, edges, _entry(spec, edges, models, family))
    reached = graph.stages_for(frozenset(Modality))
    index = {s.name: i for i, s in enumerate(spec.stages)}
    for stage in spec.stages:
        if stage.name not in reached:
            raise ConfigError(f"stages[{index[stage.name]}]: stage {stage.name!r} ({stage.model}) leads to no "
                              f"output: it needs an edge on to a stage that makes text or audio")
    if sum(e.is_codec for e in edges) > 1:
        raise ConfigError("edges: more than one codec edge")
    return graph
