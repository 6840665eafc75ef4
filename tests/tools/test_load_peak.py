"""Loading stays within the plan: the peak resident memory while a stage loads is within 10% of what ``omnistage
plan`` says its weights take, in full precision and with int8 quantized as read (a memory bound, not a timing)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

BOUND = 1.10


def _peak(folder: Path, quantization: str, *extra: str) -> dict:
    """One load in a fresh process, with glibc's heap made to count what is held: on a model this small (80 MB)
    a worker thread's first allocation opening its own malloc arena, or freed heap kept resident once a freed block
    raised the dynamic mmap threshold, moves the peak by 10-20 MB at random. One torch thread and a fixed 64 KiB
    mmap threshold (every tensor mapped on its own and unmapped when freed, as a real checkpoint's tensors, above
    glibc's 32 MiB cap, are anyway) leave only what loading allocates."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MALLOC_MMAP_THRESHOLD_": "65536"}
    out = subprocess.run(
        [sys.executable, "-m", "omnistage.tools.plan.load_peak", "--model", str(folder), "--quantization",
         quantization, *extra], env=env, capture_output=True, text=True, timeout=300, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("quantization", ["none", "int8"])
def test_loading_peaks_within_ten_percent_of_the_plan(medium_dir: Path, quantization: str) -> None:
    result = _peak(medium_dir, quantization)
    plan = result["plan_weight_bytes"]
    # The plan counts what the stage keeps: the tensors loaded are that, give or take the computed buffers.
    assert abs(result["tensor_bytes"] - plan) < 0.03 * plan, result
    assert result["peak_bytes"] <= BOUND * plan, result


def test_the_bound_catches_quantizing_after_a_full_precision_load(medium_dir: Path) -> None:
    # What loading did before quantizing as read: the whole stage in fp32, then int8 beside it.
    result = _peak(medium_dir, "int8", "--load-then-quantize")
    assert result["peak_bytes"] > 2 * result["plan_weight_bytes"], result
