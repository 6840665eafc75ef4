"""Stage configs: the preset parses; each kind of bad field is rejected naming its path."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from omnistage.config.pipeline import PRESETS, ConfigError, load_pipeline, load_preset, parse_pipeline


def _preset() -> dict:
    return yaml.safe_load((PRESETS / "qwen3_omni.yaml").read_text())


def test_preset_parses() -> None:
    spec = load_preset("qwen3_omni")
    assert spec.stage_names == ("thinker", "talker", "code2wav")
    assert spec.stage("talker").sampling.top_k == 50
    assert [(e.source, e.target) for e in spec.edges] == [("thinker", "talker"), ("talker", "code2wav")]
    assert spec.streaming.codec_chunk_frames == 25


@pytest.mark.parametrize(
    ("mutate", "path"),
    [
        (lambda d: d["stages"][1]["engine"].update(block_size=0), "stages[1].engine.block_size"),
        (lambda d: d["stages"][0].update(replicas="two"), "stages[0].replicas"),
        (lambda d: d["stages"][0].update(kind="magic"), "stages[0].kind"),
        (lambda d: d["stages"][2].update(colour="red"), "stages[2].colour"),
        (lambda d: d["stages"][0]["sampling"].update(temperature=5), "stages[0].sampling.temperature"),
        (lambda d: d["edges"][0].update({"to": "nowhere"}), "edges[0].to"),
        (lambda d: d["streaming"].update(codec_chunk_frames=0), "streaming.codec_chunk_frames"),
        (lambda d: d["stages"].append(copy.deepcopy(d["stages"][0])), "stages"),
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
