"""The pipeline as data: stages, their engines and replicas, the edges between them.

A family's preset YAML (``families/qwen3_omni/qwen3_omni.yaml``) or a user's own file is parsed into
frozen, validated dataclasses; any bad field is rejected at start-up with its
dotted path (``stages[1].engine.block_size: must be >= 1``). A stage's
``placement`` is read only by the Ray backend (``docs/ray.md``).
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field, fields, replace
from pathlib import Path

import msgspec
import yaml

from omnistage.config.memory import parse_bytes
from omnistage.sampling_params import TEMPERATURE_MAX, SamplingParams

STAGE_KINDS = ("ar", "generation")
DEVICES = ("auto", "cpu", "cuda")  # or "cuda:N": a stage (and its tensor-parallel ranks) from GPU N on
DTYPES = ("auto", "float32", "bfloat16", "float16")  # auto: bfloat16 on CUDA, float32 on CPU
# On the fly: int8 weight-only; w8a8 the same int8 weights times per-token int8 activations from a few rows up
# on CPU (the Qwen3-TTS talker only; other loaders refuse it). FP8 checkpoints are recognised from their config.
QUANTIZATIONS = ("none", "int8", "w8a8")
# What an autoregressive stage's KV cache stores: auto = the model's dtype; bfloat16 under a float32 CPU model
# halves the cache (the attention reads it back in float32).
KV_CACHE_DTYPES = ("auto", "float32", "bfloat16", "float16", "fp8_e5m2", "fp8_e4m3")  # fp8: CPU stages


class ConfigError(ValueError):
    """A stage config field is wrong; the message starts with the field's path."""


@dataclass(frozen=True)
class EngineSettings:
    block_size: int = 16
    num_kv_blocks: int = 1024
    max_num_seqs: int = 32
    max_num_batched_tokens: int = 2048
    enable_prefix_caching: bool = False
    # Order of runnable work: "fifo" (arrival, round-robin) or "deadline" (streams whose buffered audio runs
    # out first go first; code2wav stage).
    scheduling: str = "fifo"
    # KV cache sized from memory instead of num_kv_blocks (engine/kv_sizing.py): bytes (YAML may say "2GiB"),
    # or on CUDA the fraction of the device the stage may use in all. 0 = not set; kv_cache_memory wins.
    kv_cache_memory: int = 0
    gpu_memory_utilization: float = 0.0
    kv_cache_dtype: str = "auto"  # one of KV_CACHE_DTYPES
    # Longest prompt + output; 0 = the model's max positions (capped by num_kv_blocks when no budget is set).
    max_model_len: int = 0
    # A talker stage times its decode step at batch sizes 1, 2, 4, ... up to this (capped by max_num_seqs) before
    # serving, for the audio admission gate; 0 = no profile (the gate then assumes a fixed cost per stream).
    step_profile_max_batch: int = 8
    # A codec stage on a CPU decodes at most this many chunks a step: Qwen3-Omni's code2wav's upsampled activations
    # (rows x channels x 1920 samples a frame) leave the caches past a couple of rows (`bench serve`, tiny, 16
    # streams: ~86 audio-s/s at batch <= 2, 38 at batch 16). A vocoder whose calls cost more than their rows says
    # more (Qwen2.5-Omni's token2wav).
    cpu_max_batch: int = 2

    @property
    def sized_from_memory(self) -> bool:
        return bool(self.kv_cache_memory or self.gpu_memory_utilization)

    def model_len(self, max_positions: int) -> int:
        """The context one request may reach: capped by the pool only when the pool has a fixed size."""
        length = min(max_positions, self.max_model_len) if self.max_model_len else max_positions
        return length if self.sized_from_memory else min(length, self.num_kv_blocks * self.block_size)


# What a stage's ``sampling:`` starts from: a talker stops at 256 frames, the Python API's requests at 256 tokens,
# unless the stage config says otherwise (``max_tokens: null``: until the context is full).
STAGE_SAMPLING = SamplingParams(max_tokens=256)


@dataclass(frozen=True)
class PlacementSpec:
    """Where each replica of a stage runs on a Ray cluster (the local backend ignores it).

    num_cpus: CPUs the replica reserves on its node, also its torch threads (at least 1); 0 reserves none,
        so small stages share a node's cores (Ray's own default for an actor that runs).
    num_gpus: GPUs it reserves (Ray then sets ``CUDA_VISIBLE_DEVICES`` for it).
    resources: custom resources it reserves, as the nodes were started with (``ray start --resources``).
    node_labels: labels its node must carry (``ray start --labels``); a value may use Ray's selector syntax
        (``in(a,b)``, ``!x``). Pairs are kept as sorted tuples so the spec stays frozen and hashable.
    """

    num_cpus: float = 0.0
    num_gpus: float = 0.0
    resources: tuple[tuple[str, float], ...] = ()
    node_labels: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class StageSpec:
    name: str
    kind: str
    model: str
    replicas: int = 1
    device: str = "auto"
    dtype: str = "auto"
    # Processes one replica is sharded over (rank 0 in the replica's process; on CUDA one GPU each, from its
    # device on); the thinker only.
    tensor_parallel_size: int = 1
    quantization: str = "none"
    # Added to each replica process's niceness (0-19; in-process replicas, threads, ignore it). Where the stages
    # outnumber the cores, the one that runs far ahead of the stages after it (the thinker: its text outruns
    # the talker's frames) then leaves the cores to the stage that paces the audio while they compete, and takes
    # what they leave.
    nice: int = 0
    # Torch threads of each replica process: 0 splits the machine's cores evenly between all replicas; -1 gives
    # it every core (a stage that paces the audio and mostly runs alone, while the stage after it works in short
    # bursts, e.g. Qwen3-TTS's talker beside its codec decoder on a small CPU); N > 0 exactly N.
    threads: int = 0
    engine: EngineSettings = field(default_factory=EngineSettings)
    sampling: SamplingParams = STAGE_SAMPLING
    placement: PlacementSpec = field(default_factory=PlacementSpec)


@dataclass(frozen=True)
class EdgeSpec:
    source: str
    target: str
    transform: str


@dataclass(frozen=True)
class StreamingSpec:
    codec_chunk_frames: int = 25
    initial_codec_chunk_frames: int = 10
    # Frames a chunk repeats from the one before, for a vocoder that decodes each chunk alone (transformers'
    # chunked_decode uses 25). Both families' streaming vocoders keep each stream's state and their presets say 0:
    # context frames would only be sent, and counted by the chunk planner, for nothing.
    codec_left_context_frames: int = 25
    # A new audio request waits while the running streams' real-time factor, with it added, would pass this
    # (so running streams never degrade into underruns); 0 admits every request at once.
    admission_rtf_limit: float = 0.8


@dataclass(frozen=True)
class PipelineSpec:
    name: str
    stages: tuple[StageSpec, ...]
    edges: tuple[EdgeSpec, ...]
    streaming: StreamingSpec = field(default_factory=StreamingSpec)

    def stage(self, name: str) -> StageSpec:
        for s in self.stages:
            if s.name == name:
                return s
        raise KeyError(name)

    @property
    def stage_names(self) -> tuple[str, ...]:
        return tuple(s.name for s in self.stages)


def _check(cond: bool, path: str, message: str) -> None:
    if not cond:
        raise ConfigError(f"{path}: {message}")


def _build(cls: type, data: object, path: str):  # noqa: ANN202 - returns an instance of cls
    """Builds a flat dataclass from a mapping, rejecting unknown keys and wrong types."""
    _check(isinstance(data, dict), path, f"must be a mapping, got {type(data).__name__}")
    known = {f.name: f for f in fields(cls)}
    for key in data:
        _check(key in known, f"{path}.{key}", f"unknown field (known: {', '.join(known)})")
    values = {}
    for key, value in data.items():
        expected = known[key].type
        ok = {"int": isinstance(value, int) and not isinstance(value, bool), "bool": isinstance(value, bool),
              "float": isinstance(value, (int, float)) and not isinstance(value, bool),
              "str": isinstance(value, str)}.get(expected, True)
        _check(ok, f"{path}.{key}", f"must be {expected}, got {value!r}")
        values[key] = float(value) if expected == "float" else value
    return cls(**values)


def _engine(data: object, path: str) -> EngineSettings:
    if isinstance(data, dict) and "kv_cache_memory" in data:
        try:
            data = {**data, "kv_cache_memory": parse_bytes(data["kv_cache_memory"])}
        except ValueError as exc:
            raise ConfigError(f"{path}.kv_cache_memory: {exc}") from None
    e = _build(EngineSettings, data, path)
    for name in ("block_size", "num_kv_blocks", "max_num_seqs", "max_num_batched_tokens"):
        _check(getattr(e, name) >= 1, f"{path}.{name}", "must be >= 1")
    _check(e.scheduling in ("fifo", "deadline"), f"{path}.scheduling", "must be 'fifo' or 'deadline'")
    _check(0.0 <= e.gpu_memory_utilization <= 1.0, f"{path}.gpu_memory_utilization", "must be in [0, 1]")
    _check(e.kv_cache_dtype in KV_CACHE_DTYPES, f"{path}.kv_cache_dtype", f"must be one of {KV_CACHE_DTYPES}")
    _check(e.max_model_len >= 0, f"{path}.max_model_len", "must be >= 0")
    _check(e.step_profile_max_batch >= 0, f"{path}.step_profile_max_batch", "must be >= 0")
    _check(e.cpu_max_batch >= 1, f"{path}.cpu_max_batch", "must be >= 1")
    return e


def _sampling(data: object, path: str) -> SamplingParams:
    """Any ``SamplingParams`` field over ``STAGE_SAMPLING``, typed as the wire decodes it, ranged as the engine
    takes it (and temperature as the API does); an error names the field."""
    _check(isinstance(data, dict), path, f"must be a mapping, got {type(data).__name__}")
    known = SamplingParams.__struct_fields__
    for key in data:
        _check(key in known, f"{path}.{key}", f"unknown field (known: {', '.join(known)})")
    try:
        s = msgspec.convert({**msgspec.structs.asdict(STAGE_SAMPLING), **data}, SamplingParams)
    except msgspec.ValidationError as exc:
        # msgspec says where a type is wrong (`... - at `$.top_k``); a range error starts with its field's name.
        message, _, where = str(exc).partition(" - at `$.")
        field_name = where.rstrip("`") or message.split(" ", 1)[0]
        raise ConfigError(f"{path}.{field_name}: {message}" if field_name in known else f"{path}: {message}") from None
    # The API's range: a configured default is one a request could have asked for.
    _check(s.temperature <= TEMPERATURE_MAX, f"{path}.temperature", f"must be in [0, {TEMPERATURE_MAX:g}]")
    return s


def _pairs(data: object, path: str, kind: type) -> tuple[tuple[str, object], ...]:
    """A mapping of non-empty names to ``kind`` values, as sorted pairs."""
    _check(isinstance(data, dict), path, f"must be a mapping, got {type(data).__name__}")
    for key, value in data.items():
        _check(isinstance(key, str) and bool(key), path, f"keys must be non-empty strings, got {key!r}")
        ok = isinstance(value, str) and bool(value) if kind is str else (
            isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0)
        _check(ok, f"{path}.{key}", "must be a non-empty string" if kind is str else "must be a number >= 0")
    return tuple(sorted((key, kind(value)) for key, value in data.items()))


def _placement(data: object, path: str) -> PlacementSpec:
    _check(isinstance(data, dict), path, f"must be a mapping, got {type(data).__name__}")
    flat = {k: v for k, v in data.items() if k not in ("resources", "node_labels")}
    p = _build(PlacementSpec, flat, path)
    for name in ("num_cpus", "num_gpus"):
        _check(getattr(p, name) >= 0, f"{path}.{name}", "must be >= 0")
    resources = _pairs(data.get("resources", {}), f"{path}.resources", float)
    for key, _ in resources:
        # Ray names these itself; asking for them as custom resources would never match a node.
        _check(key not in ("CPU", "GPU", "memory"), f"{path}.resources.{key}", "use num_cpus/num_gpus instead")
    return PlacementSpec(p.num_cpus, p.num_gpus, resources, _pairs(data.get("node_labels", {}),
                                                                    f"{path}.node_labels", str))


def _stage(data: object, path: str) -> StageSpec:
    _check(isinstance(data, dict), path, "must be a mapping")
    flat = {k: v for k, v in data.items() if k not in ("engine", "sampling", "placement")}
    spec = _build(StageSpec, flat, path)
    _check(bool(spec.name), f"{path}.name", "must not be empty")
    _check(spec.kind in STAGE_KINDS, f"{path}.kind", f"must be one of {STAGE_KINDS}")
    _check(_known_device(spec.device), f"{path}.device", f"must be one of {DEVICES} or cuda:N")
    _check(spec.dtype in DTYPES, f"{path}.dtype", f"must be one of {DTYPES}")
    _check(spec.replicas >= 1, f"{path}.replicas", "must be >= 1")
    _check(0 <= spec.nice <= 19, f"{path}.nice", "must be in [0, 19] (a replica may lower its priority only)")
    _check(spec.threads >= -1, f"{path}.threads", "must be -1 (every core), 0 (an even share) or a count")
    _check_parallel_and_quant(spec, path)
    return StageSpec(**{**{f.name: getattr(spec, f.name) for f in fields(StageSpec)},
                        "engine": _engine(data.get("engine", {}), f"{path}.engine"),
                        "sampling": _sampling(data.get("sampling", {}), f"{path}.sampling"),
                        "placement": _placement(data.get("placement", {}), f"{path}.placement")})


def _known_device(device: str) -> bool:
    index = device.removeprefix("cuda:")
    return device in DEVICES or (device.startswith("cuda:") and index.isdigit())


def _check_parallel_and_quant(spec: StageSpec, path: str) -> None:
    _check(spec.tensor_parallel_size >= 1, f"{path}.tensor_parallel_size", "must be >= 1")
    _check(spec.quantization in QUANTIZATIONS, f"{path}.quantization", f"must be one of {QUANTIZATIONS}")
    _check(spec.quantization == "none" or spec.kind == "ar", f"{path}.quantization",
           "the vocoder stays in full precision (audio quality): quantize autoregressive stages only")


def _edge(data: object, path: str, stages: set[str]) -> EdgeSpec:
    _check(isinstance(data, dict), path, "must be a mapping")
    for key in data:
        _check(key in ("from", "to", "transform"), f"{path}.{key}", "unknown field (known: from, to, transform)")
    for key in ("from", "to", "transform"):
        _check(isinstance(data.get(key), str), f"{path}.{key}", "required string")
    _check(data["from"] in stages, f"{path}.from", f"unknown stage {data['from']!r}")
    _check(data["to"] in stages, f"{path}.to", f"unknown stage {data['to']!r}")
    return EdgeSpec(source=data["from"], target=data["to"], transform=data["transform"])


def parse_pipeline(data: object) -> PipelineSpec:
    _check(isinstance(data, dict), "<root>", "must be a mapping")
    for key in data:
        _check(key in ("name", "stages", "edges", "streaming"), key, "unknown field")
    raw_stages = data.get("stages")
    _check(isinstance(raw_stages, list) and raw_stages, "stages", "must be a non-empty list")
    stages = tuple(_stage(s, f"stages[{i}]") for i, s in enumerate(raw_stages))
    names = [s.name for s in stages]
    _check(len(set(names)) == len(names), "stages", f"duplicate stage names in {names}")
    raw_edges = data.get("edges", [])
    _check(isinstance(raw_edges, list), "edges", "must be a list")
    edges = tuple(_edge(e, f"edges[{i}]", set(names)) for i, e in enumerate(raw_edges))
    streaming = _build(StreamingSpec, data.get("streaming", {}), "streaming")
    for name in ("codec_chunk_frames", "initial_codec_chunk_frames"):
        _check(getattr(streaming, name) >= 1, f"streaming.{name}", "must be >= 1")
    _check(streaming.codec_left_context_frames >= 0, "streaming.codec_left_context_frames", "must be >= 0")
    _check(0.0 <= streaming.admission_rtf_limit <= 10.0, "streaming.admission_rtf_limit", "must be in [0, 10]")
    return PipelineSpec(name=str(data.get("name", "custom")), stages=stages, edges=edges, streaming=streaming)


def load_pipeline(path: str | Path) -> PipelineSpec:
    try:
        data = yaml.safe_load(Path(path).read_text())
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML ({exc})") from exc
    return parse_pipeline(data)


def load_preset(preset: Path) -> PipelineSpec:
    """A family's preset (:meth:`Family.preset`): a YAML its package ships beside its code."""
    return load_pipeline(preset)


# Command-line overrides ---------------------------------------------------------------------------


@dataclass(frozen=True)
class StageOverrides:
    """``serve`` flags applied over the stage config: a value for every stage (key ``""``) or per stage name.

    Memory settings, quantization and ``max_model_len`` go to autoregressive stages only (code2wav keeps no KV
    cache and stays in full precision); ``max_num_seqs`` to every stage; ``tensor_parallel_size`` (0: not given)
    to the stages whose model the family can shard (its ``StageModel.tensor_parallel``).
    """

    dtype: str = ""
    kv_cache_dtype: str = ""
    kv_cache_memory: tuple[tuple[str, int], ...] = ()
    gpu_memory_utilization: tuple[tuple[str, float], ...] = ()
    quantization: tuple[tuple[str, str], ...] = ()
    tensor_parallel_size: int = 0
    max_model_len: tuple[tuple[str, int], ...] = ()
    max_num_seqs: tuple[tuple[str, int], ...] = ()


def per_stage(text: str, parse) -> tuple[tuple[str, object], ...]:  # noqa: ANN001 - parse: str -> value
    """``2GiB`` → ``(("", v),)``; ``thinker=2GiB,talker=1GiB`` → per-stage pairs."""
    pairs = []
    for part in (p.strip() for p in text.split(",") if p.strip()):
        name, _, value = part.rpartition("=")
        pairs.append((name.strip(), parse(value.strip())))
    if not pairs:
        raise ValueError(f"no value in {text!r}")
    return tuple(pairs)


def _override(pairs: tuple[tuple[str, object], ...], stage: str, current: object) -> object:
    value = current
    for name, given in pairs:
        if name in ("", stage):
            value = given
    return value


def apply_overrides(spec: PipelineSpec, overrides: StageOverrides,
                    tensor_parallel_models: Collection[str] = ()) -> PipelineSpec:
    """``overrides`` over ``spec``; ``tensor_parallel_models``: the stage ``model:`` names the family can shard."""
    names = set(spec.stage_names)
    _check(not overrides.tensor_parallel_size or any(s.model in tensor_parallel_models for s in spec.stages),
           "--tensor-parallel-size", "no stage of this model can be sharded")
    for name, _ in (*overrides.kv_cache_memory, *overrides.gpu_memory_utilization, *overrides.quantization,
                    *overrides.max_model_len, *overrides.max_num_seqs):
        _check(not name or name in names, "--kv-cache-memory/--gpu-memory-utilization/--quantization/"
               "--max-model-len/--max-num-seqs", f"unknown stage {name!r} (stages: {', '.join(spec.stage_names)})")
    _check(overrides.dtype in ("", *DTYPES), "--dtype", f"must be one of {DTYPES}")
    _check(overrides.kv_cache_dtype in ("", *KV_CACHE_DTYPES), "--kv-cache-dtype", f"must be one of {KV_CACHE_DTYPES}")
    stages = []
    for stage in spec.stages:
        engine, quantization, size = stage.engine, stage.quantization, stage.tensor_parallel_size
        if stage.kind == "ar":
            engine = replace(engine,
                             kv_cache_memory=_override(overrides.kv_cache_memory, stage.name, engine.kv_cache_memory),
                             gpu_memory_utilization=_override(overrides.gpu_memory_utilization, stage.name,
                                                              engine.gpu_memory_utilization),
                             max_model_len=_override(overrides.max_model_len, stage.name, engine.max_model_len),
                             kv_cache_dtype=overrides.kv_cache_dtype or engine.kv_cache_dtype)
            quantization = _override(overrides.quantization, stage.name, quantization)
            _check(quantization in QUANTIZATIONS, "--quantization", f"must be one of {QUANTIZATIONS}")
        if stage.model in tensor_parallel_models and overrides.tensor_parallel_size:
            size = overrides.tensor_parallel_size
        engine = replace(engine, max_num_seqs=_override(overrides.max_num_seqs, stage.name, engine.max_num_seqs))
        _check(engine.max_num_batched_tokens >= engine.max_num_seqs, "--max-num-seqs",
               f"{stage.name}: {engine.max_num_seqs} is more than the stage's max_num_batched_tokens "
               f"({engine.max_num_batched_tokens}); raise that in a stage config")
        _check(0.0 <= engine.gpu_memory_utilization <= 1.0, "--gpu-memory-utilization", "must be in [0, 1]")
        _check(size >= 1, "--tensor-parallel-size", "must be >= 1")
        stages.append(replace(stage, engine=engine, dtype=overrides.dtype or stage.dtype, quantization=quantization,
                              tensor_parallel_size=size))
    return replace(spec, stages=tuple(stages))
