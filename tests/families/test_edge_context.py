"""What an edge's context gives a family: the request's sampling and a target stage's, both SamplingParams."""

from __future__ import annotations

import msgspec
import pytest

from omnistage.core import Modality, OmniRequest
from omnistage.families.base import EdgeContext
from omnistage.families.qwen3_omni.prompt import Qwen3OmniPrompt
from omnistage.sampling_params import SamplingParams
from tests.pipeline.specs import small_spec

TALKER = small_spec().stage("talker")


def _context(sampling: SamplingParams, floor: int = 0) -> EdgeContext:
    request = OmniRequest("r", Qwen3OmniPrompt([1, 2]), frozenset({Modality.AUDIO}), sampling)
    return EdgeContext(request, TALKER, floor)


def test_a_stage_takes_its_configured_sampling_seeded_from_the_request_with_the_floor() -> None:
    stage = _context(SamplingParams(seed=7, temperature=0.3, max_tokens=5), floor=3).stage_sampling()
    assert stage == msgspec.structs.replace(TALKER.sampling, seed=7, min_tokens=3)


def test_a_forced_sampling_value_fails_at_the_door_not_in_the_replica() -> None:
    """A frozen struct forced past its checks (as a Python caller could) is checked again before it is sent."""
    sampling = SamplingParams(max_tokens=4)
    assert _context(sampling).request_sampling() == sampling
    msgspec.structs.force_setattr(sampling, "top_p", 7.0)
    with pytest.raises(ValueError, match="top_p"):
        _context(sampling).request_sampling()
