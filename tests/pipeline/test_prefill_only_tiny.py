"""A prefill-only audio request on the real tiny pipeline (stage workers in process, the talker floor of an
embedded random checkpoint set): it ends with its one text token and no audio, its talker ran one step (no frame)
and code2wav never saw it; afterwards, and after aborts at its start and once its talker has it, no stage holds a
KV block, a queued or a running request.
"""

from __future__ import annotations

import itertools
import queue
from collections.abc import Iterator
from pathlib import Path

import pytest

from omnistage.core import FinishReason, Modality, OmniOutput, OmniRequest
from omnistage.pipeline.engine import OmniPipeline
from omnistage.pipeline.runtime import PipelineOptions
from omnistage.sampling_params import SamplingParams
from tests.pipeline.specs import small_spec
from tests.waiting import wait_until

pytestmark = pytest.mark.e2e
FLOOR = 8  # frames the talker makes at least for an ordinary request (a prefill-only one must not keep it)
IDS = itertools.count()


@pytest.fixture(scope="module")
def pipeline(tiny_dir: Path) -> Iterator[OmniPipeline]:
    p = OmniPipeline(tiny_dir, small_spec(talker_frames=32),
                     PipelineOptions(in_process=True, talker_min_new_tokens=FLOOR), "tiny")
    yield p
    p.close()


def _request(pipeline: OmniPipeline, prefill_only: bool = True) -> OmniRequest:
    processor = pipeline.front_end.processor
    assert processor is not None
    prompt = processor.process(processor.apply_chat_template([{"role": "user", "content": "warm me up"}]))
    return OmniRequest(f"warm-{next(IDS)}", prompt, frozenset({Modality.TEXT, Modality.AUDIO}),
                       SamplingParams(temperature=0.0, max_tokens=1), voice="Ethan", prefill_only=prefill_only)


def _busy(pipeline: OmniPipeline) -> dict[str, int]:
    return {f"{r.stage}/{r.replica}": r.kv_blocks_used + r.running + r.queue_depth
            for r in pipeline.stats().replicas if r.kv_blocks_used or r.running or r.queue_depth}


def _run(pipeline: OmniPipeline, request: OmniRequest, abort_after: int | None = None) -> list[OmniOutput]:
    """The request's outputs; ``abort_after``: aborted once that many have arrived (0: as soon as submitted)."""
    outputs: queue.Queue[OmniOutput] = queue.Queue()
    pipeline.submit(request, outputs.put)
    got: list[OmniOutput] = []
    while not got or not got[-1].finished:
        if abort_after == len(got):
            pipeline.abort(request.request_id)
        got.append(outputs.get(timeout=60))
    return got


def test_a_prefill_only_request_warms_thinker_and_talker_and_makes_no_audio(pipeline: OmniPipeline) -> None:
    plain = _run(pipeline, _request(pipeline, prefill_only=False))  # the control: the floor gives it frames
    got = _run(pipeline, _request(pipeline))
    assert any(o.audio is not None for o in plain)
    assert got[-1].finish_reason in (FinishReason.STOP, FinishReason.LENGTH) and got[-1].error is None
    assert all(o.audio is None for o in got) and len([t for o in got for t in o.token_ids]) == 1
    trace = pipeline.runtime.orchestrator.trace(got[-1].request_id)
    assert trace is not None and set(trace.entered) == set(trace.left) == {"thinker", "talker"}
    assert trace.first_frames is None  # one talker step: its only frame is the last, dropped
    assert wait_until(lambda: not _busy(pipeline), timeout_s=30), _busy(pipeline)


@pytest.mark.parametrize("abort_after", [0, 1])  # at its start; after its text token, with the talker holding it
def test_an_aborted_prefill_only_request_frees_every_stage(pipeline: OmniPipeline, abort_after: int) -> None:
    for _ in range(3):
        got = _run(pipeline, _request(pipeline), abort_after)
        assert got[-1].finished and all(o.audio is None for o in got)
    assert wait_until(lambda: not _busy(pipeline), timeout_s=30), _busy(pipeline)
    after = _run(pipeline, _request(pipeline))  # the pipeline still serves
    assert after[-1].finish_reason in (FinishReason.STOP, FinishReason.LENGTH)
