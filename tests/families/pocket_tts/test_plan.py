"""``omnistage plan`` on a Pocket TTS checkpoint: its two stages' weight bytes are the stored tensors' the workers
load, and the stage config it writes is the family's preset, which serve parses."""

from __future__ import annotations

import math

import pytest
import yaml
from safetensors import safe_open

from omnistage.config.pipeline import parse_pipeline
from omnistage.entrypoints.cli import main as cli_main
from omnistage.families.pocket_tts.config import CODEC_FOLDER, PocketCheckpoint
from omnistage.tools.plan.cli import make_plan
from omnistage.tools.plan.placement import Devices


def _stored(path, prefixes=("",)) -> int:
    with safe_open(str(path), "pt") as f:
        return sum(math.prod(f.get_slice(k).get_shape()) for k in f.keys() if k.startswith(prefixes))


def test_plan_counts_the_stages_the_workers_load(pocket_lsd):
    placement, _ = make_plan(pocket_lsd, Devices.parse("cpu:8GiB"))
    plans = {p.name: p for p in placement.stages}
    assert plans["backbone"].weight_bytes == 4 * _stored(pocket_lsd / "model.safetensors")
    decoder = _stored(pocket_lsd / CODEC_FOLDER / "model.safetensors", ("latent_proj.", "decoder."))
    assert 0 < plans["decoder"].weight_bytes == 4 * decoder  # the encoder (cloning only) is not the stage's
    model = PocketCheckpoint.from_folder(pocket_lsd).model
    assert plans["backbone"].kv_bytes_per_token == 2 * model.num_hidden_layers * model.hidden_size * 4
    assert plans["decoder"].kv_bytes_per_token == 0


def test_plan_writes_the_pocket_preset(pocket_lsd, tmp_path, capsys: pytest.CaptureFixture[str]):
    out = tmp_path / "plan.yaml"
    assert cli_main(["plan", "--model", str(pocket_lsd), "--devices", "cpu:8GiB", "--kv-cache-dtype", "bfloat16",
                     "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert printed.splitlines()[1].startswith("backbone") and printed.splitlines()[2].startswith("decoder")
    spec = parse_pipeline(yaml.safe_load(out.read_text()))
    assert [(s.name, s.device) for s in spec.stages] == [("backbone", "cpu"), ("decoder", "cpu")]
    assert spec.stages[0].engine.kv_cache_dtype == "bfloat16"
