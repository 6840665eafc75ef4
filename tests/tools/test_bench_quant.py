"""``omnistage bench quant``: both runs on one loaded model, the quantized one really quantized, agreement
counted over the unquantized run's tokens (the figures are the benchmark's, not asserted here)."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from omnistage.entrypoints.cli import main as cli_main
from omnistage.tools.bench.quant import bench_quant


def test_reports_both_runs_and_agreement(tiny_dir: Path) -> None:
    report = bench_quant(str(tiny_dir), "int8", prompt_len=8, output_len=8, repeats=1, device="cpu",
                         dtype=torch.float32)
    assert len(report.baseline.tokens) == len(report.quantized.tokens) == 8
    assert report.quantized.weight_bytes < report.baseline.weight_bytes  # 1-byte decoder weights
    assert 0.0 <= report.free_running_agreement <= 1.0 and 0.0 <= report.teacher_forced_agreement <= 1.0
    assert report.speedup > 0 and report.median_margin >= 0


def test_cli_writes_json(tiny_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "quant.json"
    assert cli_main(["bench", "quant", "--model", str(tiny_dir), "--output-len", "6", "--repeats", "1",
                     "--json", str(out)]) == 0
    payload = json.loads(out.read_text())
    assert payload["quantization"] == "int8" and len(payload["baseline"]["tokens"]) == 6
