"""A family registered by a test runs end to end through the orchestrator: the stage YAML's names resolve
through it, its payloads cross the replica boundary, and no Qwen3 model code is imported."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from omnistage.config.pipeline import ConfigError, parse_pipeline
from omnistage.families.registry import FamilyRegistry, UnknownFamily
from omnistage.pipeline.graph import resolve_graph
from tests.pipeline.toy_family import SAMPLES, SPEC, ToyFamily

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("replicas", ["threads", "processes"])
def test_a_toy_family_serves_text_and_audio_without_qwen3_code(replicas: str) -> None:
    run = subprocess.run([sys.executable, "-m", "tests.pipeline.toy_family", "4", replicas], capture_output=True,
                         text=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads(run.stdout.strip().splitlines()[-1])
    assert result["error"] is None and result["reason"] == "stop"
    assert result["text"] == "bcde"  # tokens 1..4 as letters, from the entry stage
    assert result["audio"] == [float(t) for t in (1, 2, 3, 4) for _ in range(SAMPLES)]  # through the toy edge
    assert result["usage"] == [1, 4]
    assert result["imported"] == []


def test_the_toy_family_is_found_by_its_config_and_names_are_checked() -> None:
    registry = FamilyRegistry({}).with_family(ToyFamily())
    assert registry.for_config({"model_type": "toy"}).name == "toy"
    with pytest.raises(UnknownFamily, match="no known family"):
        registry.for_config({"model_type": "qwen3_omni_moe"})
    bad = {**SPEC, "edges": [{"from": "writer", "to": "speaker", "transform": "toy.nothing"}]}
    with pytest.raises(ConfigError, match=r"edges\[0\].transform: toy has no transform 'toy.nothing'"):
        resolve_graph(parse_pipeline(bad), ToyFamily())
    swapped = {**SPEC, "edges": [{"from": "speaker", "to": "writer", "transform": "toy.letters_to_tones"}]}
    with pytest.raises(ConfigError, match="reads a 'letters' stage"):
        resolve_graph(parse_pipeline(swapped), ToyFamily())
