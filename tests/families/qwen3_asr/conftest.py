"""Qwen3-ASR's tiny checkpoints, made offline once per session: the recogniser in both layouts, and the aligner."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def asr_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from omnistage.families.qwen3_asr.make_tiny import make_tiny

    return make_tiny(tmp_path_factory.mktemp("asr-tiny"), seed=0)


@pytest.fixture(scope="session")
def aligner_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from omnistage.families.qwen3_asr.make_tiny import make_tiny

    return make_tiny(tmp_path_factory.mktemp("aligner-tiny"), seed=0, aligner=True)
