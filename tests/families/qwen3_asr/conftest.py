"""Qwen3-ASR's tiny checkpoints, made offline once per session: the recogniser in both layouts, and the aligner."""

from __future__ import annotations

from collections.abc import Iterator
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


@pytest.fixture(scope="session")
def asr_url(asr_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The OpenAI server on the tiny recogniser's pipeline (in process, a small KV pool), served as ``asr``."""
    yield from _serve(asr_dir, tmp_path_factory)


@pytest.fixture(scope="session")
def aligned_url(asr_dir: Path, aligner_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The same, with the tiny forced aligner served beside the recogniser (``serve --aligner``)."""
    yield from _serve(asr_dir, tmp_path_factory, aligner_dir)


def _serve(asr_dir: Path, tmp_path_factory: pytest.TempPathFactory, aligner: Path | None = None) -> Iterator[str]:
    import yaml

    from omnistage.families.qwen3_asr.family import PRESET
    from omnistage.pipeline.async_omni import AsyncOmni
    from omnistage.pipeline.engine import OmniPipeline
    from omnistage.pipeline.runtime import PipelineOptions
    from tests.entrypoints.server_thread import serving

    data = yaml.safe_load(PRESET.read_text())
    data["stages"][0]["engine"].update(num_kv_blocks=256, max_num_seqs=8)
    spec = tmp_path_factory.mktemp("stages") / "qwen3_asr_small.yaml"
    spec.write_text(yaml.safe_dump(data))
    engine = AsyncOmni(pipeline=OmniPipeline(asr_dir, spec, PipelineOptions(in_process=True), "asr",
                                             aligner=aligner))
    with serving(engine) as url:
        yield url
