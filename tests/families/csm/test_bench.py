"""``bench serve --backend openai-audio-speech --baseline hf`` on a tiny CSM: the family's hf baseline is
transformers' own generate, and every stream makes its frames."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e


def test_hf_baseline_is_transformers_generate(csm_tiny: Path, tmp_path: Path) -> None:
    from omnistage.tools.bench.cli import add_serve_parser

    parser = argparse.ArgumentParser()
    add_serve_parser(parser.add_subparsers())
    out = tmp_path / "bench.json"
    args = parser.parse_args(["serve", "--backend", "openai-audio-speech", "--model", str(csm_tiny), "--concurrency",
                              "2", "--num-prompts", "2", "--random-input-len", "4", "--audio-frames", "6",
                              "--warmup", "0", "--baseline", "hf", "--hf-num-prompts", "1", "--no-progress",
                              "--json", str(out)])
    assert args.func(args) == 0
    report = json.loads(out.read_text())
    level = report["concurrency"]["2"]
    assert level["completed"] == 2 and level["failed"] == 0 and level["audio_streams"] == 2
    assert report["sequential_baseline"]["mean_audio_s"] == pytest.approx(6 * 1920 / 24000)  # generate's 6 frames
    assert level["audio_throughput"] > 0 and "audio_throughput_ratio_vs_hf" in level
