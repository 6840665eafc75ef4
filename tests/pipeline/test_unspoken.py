"""Thinker text a request marks unspoken (a tool call) never reaches the talker; an answer with nothing to speak
finishes without audio instead of waiting for it."""

from __future__ import annotations

import queue

import pytest

from omnistage.core import FinishReason, Modality, OmniRequest, UnspokenSpan
from omnistage.pipeline.runtime import PipelineOptions, PipelineRuntime
from omnistage.families.spoken import SpokenTokens
from omnistage.families.qwen3_omni.prompt import Qwen3OmniPrompt
from omnistage.sampling_params import SamplingParams
from tests.pipeline import fakes
from tests.pipeline.specs import small_spec
from tests.pipeline.test_fake_pipeline import _collect

AUDIO = frozenset({Modality.TEXT, Modality.AUDIO})


def test_spoken_tokens_across_pieces() -> None:
    spoken = SpokenTokens(UnspokenSpan(open_id=7, close_id=8))
    assert spoken.take([1, 7, 2]) + spoken.take([3, 8, 4]) + spoken.take([7]) + spoken.take([8, 5]) == [1, 4, 5]
    forced = SpokenTokens(UnspokenSpan(7, 8, open_at_start=True))
    assert forced.take([2, 3]) + forced.take([8, 9]) == [9]
    assert SpokenTokens(None).take([7, 8]) == [7, 8]


@pytest.fixture
def runtime():
    fakes.INSTANCES.clear()
    rt = PipelineRuntime(fakes.omni_graph(small_spec(talker_frames=10)), fakes.fake_factories(0.001, 0.001), None, fakes.AUDIO,
                         PipelineOptions(in_process=True))
    yield rt
    rt.close()


def _talker(runtime: PipelineRuntime) -> fakes.FakeTalker:
    return next(w for w in fakes.INSTANCES if isinstance(w, fakes.FakeTalker))


def test_the_talker_is_fed_only_spoken_tokens(runtime: PipelineRuntime) -> None:
    outputs: queue.Queue = queue.Queue()
    request = OmniRequest("a", Qwen3OmniPrompt([1, 2, 3]), AUDIO, SamplingParams(max_tokens=6),
                          unspoken=UnspokenSpan(open_id=102, close_id=104))
    runtime.orchestrator.submit(request, outputs.put)
    got = _collect(outputs)
    assert [t for o in got for t in o.token_ids] == [101, 102, 103, 104, 105, 106]  # the caller sees all text
    assert _talker(runtime).spoken["a"] == [101, 105, 106]
    assert any(o.audio is not None for o in got)


def test_nothing_to_speak_finishes_without_audio(runtime: PipelineRuntime) -> None:
    outputs: queue.Queue = queue.Queue()
    request = OmniRequest("b", Qwen3OmniPrompt([1, 2, 3]), AUDIO, SamplingParams(max_tokens=4),
                          unspoken=UnspokenSpan(open_id=900, close_id=901, open_at_start=True))
    runtime.orchestrator.submit(request, outputs.put)
    got = _collect(outputs)
    assert got[-1].finish_reason is FinishReason.LENGTH
    assert all(o.audio is None for o in got) and "b" not in _talker(runtime).spoken
