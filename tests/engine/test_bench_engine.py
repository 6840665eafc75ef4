"""``omnistage bench engine``: the JSON it writes, and batching paying off on the tiny thinker."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from omnistage.entrypoints.cli import main


@pytest.fixture(scope="module")
def tiny_thinker(tiny_dir: Path):
    import torch

    from omnistage.tools.bench.engine import load_stage

    return load_stage(str(tiny_dir), "thinker", "cpu", torch.float32)


def test_cli_writes_results_json(tiny_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "bench.json"
    code = main(["bench", "engine", "--model", str(tiny_dir), "--stage", "thinker", "--batch", "1,2",
                 "--output-len", "4", "--repeats", "1", "--json", str(out)])
    assert code == 0
    results = json.loads(out.read_text())["results"]
    assert [r["batch"] for r in results] == [1, 2] and all(r["tokens_per_s"] > 0 for r in results)
    assert "tokens/s" in capsys.readouterr().out
    assert main(["bench", "engine", "--model", str(tiny_dir), "--stage", "talker", "--batch", "2",
                 "--output-len", "3", "--repeats", "1"]) == 0


def test_batch_16_beats_batch_1_by_6x(tiny_thinker) -> None:
    from omnistage.tools.bench.engine import bench_engine

    results = bench_engine(tiny_thinker, [1, 16], prompt_len=16, output_len=32, repeats=3)
    ratio = results[1].tokens_per_s / results[0].tokens_per_s
    assert ratio >= 6.0, f"batch 16 only {ratio:.1f}x batch 1"
