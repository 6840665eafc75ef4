"""The server's sampling defaults: a SamplingParams value, the entry stage's under the checkpoint's file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from omnistage.config.generation_defaults import sampling_defaults
from omnistage.sampling_params import SamplingParams

STAGE = SamplingParams(temperature=0.0, top_k=5, stop_token_ids=(7,), max_tokens=256)


def _folder(tmp_path: Path, **keys: object) -> Path:
    (tmp_path / "generation_config.json").write_text(json.dumps(keys))
    return tmp_path


def test_the_stage_under_the_checkpoints_file_with_no_length_of_its_own(tmp_path: Path) -> None:
    """The stage's cap bounds its talker or the Python API, not the server: the server's requests get the room their
    prompt leaves unless the checkpoint sets max_new_tokens."""
    assert sampling_defaults(STAGE, tmp_path) == SamplingParams(temperature=0.0, top_k=5, stop_token_ids=(7,))
    folder = _folder(tmp_path, do_sample=True, temperature=0.7, top_p=0.8, top_k=20, max_new_tokens=64)
    assert sampling_defaults(STAGE, folder) == SamplingParams(temperature=0.7, top_p=0.8, top_k=20,
                                                              stop_token_ids=(7,), max_tokens=64)
    assert sampling_defaults(STAGE, folder, "vllm").max_tokens is None
    assert sampling_defaults(STAGE, _folder(tmp_path, temperature=0.7, do_sample=False)).greedy


def test_a_checkpoint_default_out_of_range_is_refused_at_load_naming_the_file(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="generation_config.json: top_p must be"):
        sampling_defaults(STAGE, _folder(tmp_path, top_p=1.5))

