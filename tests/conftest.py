"""Shared fixtures: one tiny checkpoint per test session, made offline."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

# Without CUDA, Triton kernels can only run under Triton's interpreter (numpy on CPU tensors). The switch is
# read when triton is first imported, so it is set here, before any test module imports it.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if torch.cuda.is_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from omnistage.families.qwen3_omni.make_tiny import make_tiny

    return make_tiny(tmp_path_factory.mktemp("tiny"), seed=0)


@pytest.fixture(scope="session")
def medium_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The ``--size medium`` checkpoint (real codec layout, ~75M parameters; ~6 s to make)."""
    from omnistage.families.qwen3_omni.checkpoint_sizes import MEDIUM
    from omnistage.families.qwen3_omni.make_tiny import make_tiny

    return make_tiny(tmp_path_factory.mktemp("medium"), seed=0, size=MEDIUM)


@pytest.fixture
def interpreted_triton() -> None:
    """Skips unless Triton is installed and interpreted (kernels then take CPU tensors)."""
    pytest.importorskip("triton")
    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("Triton kernels are interpreted only on machines without CUDA")
