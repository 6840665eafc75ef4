"""Stage configs for tests: the preset, shrunk so the tiny model finishes quickly."""

from __future__ import annotations

from pathlib import Path

import yaml

from omnistage.config.pipeline import PipelineSpec, parse_pipeline
from omnistage.families.qwen3_omni.family import PRESET as OMNI_PRESET
from omnistage.families.qwen3_tts.family import PRESET as TTS_PRESET


def preset_dict() -> dict:
    return yaml.safe_load(OMNI_PRESET.read_text())


def small_dict(talker_replicas: int = 1, talker_frames: int = 24, initial_chunk: int = 4, chunk: int = 8,
               gated: bool = True) -> dict:
    """The Qwen3-Omni preset, small. ``gated=False`` turns the audio gate off: routing tests need requests that
    overlap in a stage, and the gate (tested on its own) starts a burst's first stream alone and the next ones once it
    is measured, so on a loaded host the first of two requests submitted together can be gone from a stage before
    the second arrives."""
    data = preset_dict()
    thinker, talker, code2wav = data["stages"]
    thinker["engine"].update(num_kv_blocks=64)
    talker["engine"].update(num_kv_blocks=64)
    talker["replicas"] = talker_replicas
    talker["sampling"]["max_tokens"] = talker_frames
    data["streaming"] = {"codec_chunk_frames": chunk, "initial_codec_chunk_frames": initial_chunk,
                         "codec_left_context_frames": 4}
    if not gated:
        data["streaming"]["admission_rtf_limit"] = 0
    return data


RAY_SLOT, RAY_LABEL = "omnistage_talker_slot", "omnistage-role"  # the second Ray node's resource; both nodes' label


def two_node_dict(talker_frames: int) -> dict:
    """``small_dict`` on two Ray nodes: the thinker on the head (label ``head``), two talker replicas on the node
    with the talker slots and code2wav on the node labelled ``vocoder`` (the second)."""
    data = small_dict(talker_replicas=2, talker_frames=talker_frames)
    thinker, talker, code2wav = data["stages"]
    talker["engine"]["num_kv_blocks"] = 256  # two streams of talker_frames frames per talker replica
    thinker["placement"] = {"num_cpus": 0.5, "node_labels": {RAY_LABEL: "head"}}
    talker["placement"] = {"num_cpus": 0.25, "resources": {RAY_SLOT: 0.5}}
    code2wav["placement"] = {"node_labels": {RAY_LABEL: "vocoder"}}
    return data


def small_spec(**kwargs: int) -> PipelineSpec:
    return parse_pipeline(small_dict(**kwargs))


def write_spec(folder: Path, data: dict, name: str = "stages.yaml") -> Path:
    path = folder / name
    path.write_text(yaml.safe_dump(data))
    return path


def tts_small_dict(first_chunk: int = 2, chunk: int = 3) -> dict:
    """The Qwen3-TTS preset with room for a few short requests and small codec chunks (several per request)."""
    data = yaml.safe_load(TTS_PRESET.read_text())
    talker, _ = data["stages"]
    talker["engine"].update(num_kv_blocks=64, max_num_batched_tokens=512)
    data["streaming"] = {"codec_chunk_frames": chunk, "initial_codec_chunk_frames": first_chunk,
                         "codec_left_context_frames": 0}
    return data
