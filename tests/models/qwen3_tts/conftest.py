"""Tiny Qwen3-TTS checkpoints of each type (one per session), and the qwen-tts reference's answers on them."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from omnistage.models.qwen3_tts.checkpoint import Qwen3TTSModels
from omnistage.models.qwen3_tts.request import TextTokenizer
from omnistage.families.qwen3_tts.checkpoint_config import TTS_MODEL_TYPES

MAX_NEW_TOKENS = 10  # talker steps of the parity cases: 9 frames


@pytest.fixture(scope="session")
def tts_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    from omnistage.families.qwen3_tts.make_tiny import make_tiny_tts

    return {kind: make_tiny_tts(tmp_path_factory.mktemp(f"tts-{kind}"), seed=0, tts_model_type=kind)
            for kind in TTS_MODEL_TYPES}


@pytest.fixture(scope="session")
def tts_models(tts_dirs: dict[str, Path]) -> dict[str, Qwen3TTSModels]:
    return {kind: Qwen3TTSModels.load(folder) for kind, folder in tts_dirs.items()}


@pytest.fixture(scope="session")
def tts_tokenizer(tts_dirs: dict[str, Path]) -> TextTokenizer:
    return TextTokenizer(tts_dirs["custom_voice"])  # the same offline tokenizer in every tiny folder


@pytest.fixture(scope="session")
def probe_codes() -> torch.Tensor:
    """Codes ``[4, 90]``: longer than the decoder's 72-frame window."""
    return torch.randint(0, 64, (4, 90), generator=torch.Generator().manual_seed(3))


@pytest.fixture(scope="session")
def reference(tts_dirs: dict[str, Path], tts_models: dict[str, Qwen3TTSModels], probe_codes: torch.Tensor,
              tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, torch.Tensor]]:
    """Per checkpoint type: the reference's codes and waveform of every verify case, its decode of
    ``probe_codes``, and its encoding and x-vector of the synthetic voice. One reference process per type."""
    from omnistage.tools.verify.tts_compare import cases_for, job_case, synthetic_voice
    from omnistage.tools.verify.tts_reference_env import ReferenceUnavailable, reference_python, run_reference

    try:
        reference_python()
    except ReferenceUnavailable as exc:
        pytest.skip(f"the qwen-tts reference environment cannot be made here: {exc}")
    out = {}
    for kind, folder in tts_dirs.items():
        work = tmp_path_factory.mktemp(f"reference-{kind}")
        np.save(work / "voice.npy", synthetic_voice())
        np.save(work / "codes.npy", probe_codes.numpy())
        job = {"model": str(folder), "max_new_tokens": MAX_NEW_TOKENS,
               "cases": [job_case(c, work / "voice.npy") for c in cases_for(tts_models[kind].config)],
               "probes": {"codes": str(work / "codes.npy"), "audio": str(work / "voice.npy")}}
        out[kind] = run_reference(job, work)
    return out
