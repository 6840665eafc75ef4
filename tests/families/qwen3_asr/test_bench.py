"""``omnistage bench serve --backend openai-audio-transcriptions``: the per-level audio figures from known records,
and one short run on the tiny recogniser (in process, against transformers' ``generate``) writing its JSON."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from omnistage.tools.bench.metrics import StreamRecord
from omnistage.tools.bench.transcription import Clip, audio_figures

REPO = Path(__file__).resolve().parents[3]


def test_audio_figures_count_input_audio_over_wall_time() -> None:
    clips = [Clip([], "", np.zeros(16000 * s, np.float32)) for s in (10, 5, 2)]
    records = [StreamRecord(0.0, end=end) for end in (2.0, 2.0, 1.0)]
    records[2].error = "failed"  # not counted
    figures = audio_figures(records, clips, wall=3.0)
    assert figures["audio_s_per_wall_s"] == pytest.approx(15 / 3)
    assert figures["p50_rtf"] == pytest.approx(np.median([2 / 10, 2 / 5]))


@pytest.mark.e2e
def test_a_short_run_on_the_tiny_writes_its_figures(asr_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    cmd = [sys.executable, "-m", "omnistage.entrypoints.cli", "bench", "serve", "--backend",
           "openai-audio-transcriptions", "--model", str(asr_dir), "--concurrency", "1,2", "--num-prompts", "2",
           "--audio-seconds", "2", "--output-tokens", "8", "--ignore-eos", "--baseline", "hf", "--hf-num-prompts",
           "1", "--warmup", "0", "--no-progress", "--json", str(out)]
    run = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    report = json.loads(out.read_text())
    assert report["backend"] == "openai-audio-transcriptions" and report["hf_baseline"]["audio_s_per_wall_s"] > 0
    for level in ("1", "2"):
        figures = report["concurrency"][level]
        assert figures["completed"] == 2 and figures["total_output_tokens"] == 16  # --ignore-eos: 8 tokens each
        assert figures["audio_s_per_wall_s"] > 0 and figures["p50_rtf"] > 0
        assert "audio_s_per_wall_s_ratio_vs_hf" in figures
