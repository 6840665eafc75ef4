"""Higgs Audio v2 against transformers on random tiny checkpoints: greedy frames identical (a text prompt and a
cloned voice's, on the confident tiny and on transformers' own initialisation), the de-delay the codec edge
applies equal to the processor's, and the decoded waveform and a clone's codes transformers' own when its
tokenizer class can run (it needs torchaudio)."""

from __future__ import annotations

import importlib.util

import pytest

from omnistage.families.higgs_audio_v2.make_tiny import make_tiny_higgs
from omnistage.families.higgs_audio_v2.verify import run_higgs_verify


def _check(results) -> None:
    by_name = {r.name: r for r in results}
    for name in ("codes", "codes_cloned", "frames"):
        assert by_name[name].max_abs_diff == 0, by_name[name]
    assert by_name["streamed"].ok, by_name["streamed"]
    for name in ("waveform", "voice_codes"):
        if importlib.util.find_spec("torchaudio") is not None:
            assert not by_name[name].skipped and by_name[name].ok, by_name[name]


def test_confident_tiny_matches_transformers(higgs_tiny):
    _check(run_higgs_verify(higgs_tiny, frames=24))


@pytest.mark.slow
def test_plain_random_tiny_matches_transformers(tmp_path):
    """transformers' initialisation, no confident heads: nothing tuned to hide a difference."""
    _check(run_higgs_verify(make_tiny_higgs(tmp_path, confident=False), frames=24))
