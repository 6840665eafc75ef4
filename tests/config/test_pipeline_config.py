"""Stage configs: the preset parses; each kind of bad field is rejected naming its path."""

from __future__ import annotations

import copy
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from omnistage.config.pipeline import (
    STAGE_SAMPLING,
    ConfigError,
    load_pipeline,
    load_preset,
    parse_pipeline,
)
from omnistage.families.qwen3_omni.family import PRESET as OMNI_PRESET
from omnistage.families.qwen3_tts.family import PRESET as TTS_PRESET
from omnistage.sampling_params import SamplingParams


def _preset() -> dict:
    return yaml.safe_load(OMNI_PRESET.read_text())


def test_preset_parses() -> None:
    spec = load_preset(OMNI_PRESET)
    assert spec.stage_names == ("thinker", "talker", "code2wav")
    assert spec.stage("talker").sampling.top_k == 50
    assert [(e.source, e.target) for e in spec.edges] == [("thinker", "talker"), ("talker", "code2wav")]
    assert spec.streaming.codec_chunk_frames == 25



def test_a_stages_sampling_is_a_sampling_params_value() -> None:
    """What a stage's ``sampling:`` leaves unset is ``STAGE_SAMPLING``'s; every field of the one type may be set."""
    data = _preset()
    data["stages"][0]["sampling"] = {"top_k": 5, "stop_token_ids": [7], "stop": ["END"], "seed": 3}
    data["stages"][1].pop("sampling")
    data["stages"][2]["sampling"] = {"max_tokens": None}
    spec = parse_pipeline(data)
    assert spec.stage("thinker").sampling == SamplingParams(top_k=5, stop_token_ids=(7,), stop=("END",), seed=3,
                                                            max_tokens=STAGE_SAMPLING.max_tokens)
    assert spec.stage("talker").sampling == STAGE_SAMPLING and STAGE_SAMPLING.max_tokens == 256
    assert spec.stage("code2wav").sampling.max_tokens is None


def test_config_parsing_imports_no_torch() -> None:
    """``serve`` reads its flags and stage config before loading anything: those modules stay light."""
    code = ("import sys, omnistage.pipeline.serve_flags, omnistage.config.pipeline, omnistage.sampling_params; "
            "print(sorted(m for m in ('torch', 'omnistage.engine') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stderr

@pytest.mark.parametrize(
    ("mutate", "path"),
    [
        (lambda d: d["stages"][1]["engine"].update(block_size=0), "stages[1].engine.block_size"),
        (lambda d: d["stages"][0].update(replicas="two"), "stages[0].replicas"),
        (lambda d: d["stages"][0].update(kind="magic"), "stages[0].kind"),
        (lambda d: d["stages"][1].update(nice=-5), "stages[1].nice"),  # raising a priority needs privileges
        (lambda d: d["stages"][0].update(nice=20), "stages[0].nice"),
        (lambda d: d["stages"][0].update(threads=-2), "stages[0].threads"),
        (lambda d: d["stages"][2].update(colour="red"), "stages[2].colour"),
        (lambda d: d["stages"][0]["sampling"].update(temperature=5), "stages[0].sampling.temperature"),
        (lambda d: d["stages"][1]["sampling"].update(top_k=1.5), "stages[1].sampling.top_k"),
        (lambda d: d["stages"][1]["sampling"].update(top_p=0), "stages[1].sampling.top_p"),
        (lambda d: d["stages"][0]["sampling"].update(min_tokens=300), "stages[0].sampling.min_tokens"),
        (lambda d: d["stages"][0]["sampling"].update(colour="red"), "stages[0].sampling.colour"),
        (lambda d: d["stages"][0].update(sampling=[0.7]), "stages[0].sampling"),
        (lambda d: d["edges"][0].update({"to": "nowhere"}), "edges[0].to"),
        (lambda d: d["streaming"].update(codec_chunk_frames=0), "streaming.codec_chunk_frames"),
        (lambda d: d["stages"].append(copy.deepcopy(d["stages"][0])), "stages"),
        (lambda d: d["stages"][0].update(placement={"num_gpus": -1}), "stages[0].placement.num_gpus"),
        (lambda d: d["stages"][0].update(placement={"gpus": 1}), "stages[0].placement.gpus"),
        (lambda d: d["stages"][1].update(placement={"resources": {"cheap": "yes"}}),
         "stages[1].placement.resources.cheap"),
        (lambda d: d["stages"][1].update(placement={"resources": {"GPU": 1}}), "stages[1].placement.resources.GPU"),
        (lambda d: d["stages"][2].update(placement={"node_labels": {"tier": 3}}),
         "stages[2].placement.node_labels.tier"),
        (lambda d: d["stages"][2].update(placement=["cpu"]), "stages[2].placement"),
    ],
)
def test_bad_field_is_named(mutate, path: str) -> None:
    data = _preset()
    mutate(data)
    with pytest.raises(ConfigError) as err:
        parse_pipeline(data)
    assert str(err.value).startswith(path)


def test_bad_yaml_file(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("stages: [unclosed")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_pipeline(bad)


def test_placement_parses_into_frozen_sorted_pairs() -> None:
    data = _preset()
    data["stages"][0]["placement"] = {"num_gpus": 1, "node_labels": {"tier": "gpu", "zone": "in(a,b)"}}
    data["stages"][2]["placement"] = {"num_cpus": 2, "resources": {"cheap": 1, "big_mem": 0.5}}
    spec = parse_pipeline(data)
    thinker, code2wav = spec.stage("thinker").placement, spec.stage("code2wav").placement
    assert (thinker.num_gpus, thinker.num_cpus) == (1.0, 0.0)
    assert thinker.node_labels == (("tier", "gpu"), ("zone", "in(a,b)"))
    assert code2wav.resources == (("big_mem", 0.5), ("cheap", 1.0)) and code2wav.num_cpus == 2.0
    assert spec.stage("talker").placement == type(thinker)()  # absent: reserves nothing, any node
    hash(spec)  # frozen all the way down


def test_tensor_parallel_and_quantization_per_stage() -> None:
    from omnistage.config.pipeline import StageOverrides, apply_overrides

    data = yaml.safe_load(OMNI_PRESET.read_text())
    data["stages"][0].update(tensor_parallel_size=2, device="cuda:1", quantization="int8")
    spec = parse_pipeline(data)
    assert (spec.stages[0].tensor_parallel_size, spec.stages[0].device, spec.stages[0].quantization) == \
        (2, "cuda:1", "int8")
    spec = apply_overrides(spec, StageOverrides(quantization=(("talker", "int8"),), tensor_parallel_size=4),
                           tensor_parallel_models=("thinker",))
    assert [s.quantization for s in spec.stages] == ["int8", "int8", "none"]
    assert [s.tensor_parallel_size for s in spec.stages] == [4, 1, 1]
    with pytest.raises(ConfigError, match="can be sharded"):  # a family with no shardable stage
        apply_overrides(spec, StageOverrides(tensor_parallel_size=2))
    for stage, key, value, message in [(2, "quantization", "int8", "vocoder stays in full precision"),
                                       (0, "quantization", "int4", "must be one of")]:
        bad = copy.deepcopy(yaml.safe_load(OMNI_PRESET.read_text()))
        bad["stages"][stage][key] = value
        with pytest.raises(ConfigError, match=message):
            parse_pipeline(bad)


def test_a_stage_may_take_more_than_its_share_of_threads() -> None:
    """threads: 0 an even share of the cores, -1 every core, N exactly N (the TTS talker beside its decoder)."""
    from dataclasses import replace

    from omnistage.pipeline.runtime import local_threads

    talker = load_preset(TTS_PRESET).stage("talker")
    assert local_threads(replace(talker, threads=0), replicas=2, cores=2) == 1
    assert local_threads(replace(talker, threads=0), replicas=3, cores=2) == 1
    assert local_threads(replace(talker, threads=0), replicas=2, cores=16) == 8
    assert local_threads(replace(talker, threads=-1), replicas=2, cores=2) == 2
    assert local_threads(replace(talker, threads=3), replicas=2, cores=16) == 3
