"""What a prefill-only audio request is for, through the real tiny pipeline: it leaves the talker's prefix cache
holding its prompt's rows, so the reply to the same conversation prefills only the rows past them in the talker
(the keys and their parity with a recompute are ``test_talker_prefix_cache.py``'s)."""

from __future__ import annotations

import queue
from pathlib import Path

import numpy as np
import pytest

from omnistage.core import FinishReason, Modality, OmniOutput, OmniRequest
from omnistage.engine import Request
from omnistage.families.qwen3_omni.payloads import TalkerStart
from omnistage.families.qwen3_omni.workers import TalkerWorker
from omnistage.families.registry import DEFAULT_REGISTRY
from omnistage.ipc.messages import RequestFailed, StageInput, StageOutput
from omnistage.pipeline.graph import resolve_graph
from omnistage.pipeline.runtime import PipelineOptions, PipelineRuntime, model_factories
from omnistage.sampling_params import SamplingParams
from omnistage.workers.base import WorkerSpec
from tests.pipeline.specs import small_spec

pytestmark = pytest.mark.e2e
AUDIO = frozenset({Modality.TEXT, Modality.AUDIO})


class _Talker(TalkerWorker):
    """The real talker worker, keeping each engine request it starts (its ``num_cached_tokens`` is read after)."""

    def __init__(self, spec: WorkerSpec) -> None:
        super().__init__(spec)
        self.started: dict[str, Request] = {}

    def handle(self, message: StageInput) -> list[StageOutput | RequestFailed]:
        out = super().handle(message)
        if isinstance(message.payload, TalkerStart):
            self.started[message.request_id] = self.engine.scheduler.requests[message.request_id]
        return out


def _run(runtime: PipelineRuntime, request: OmniRequest) -> list[OmniOutput]:
    outputs: queue.Queue[OmniOutput] = queue.Queue()
    runtime.orchestrator.submit(request, outputs.put)
    got = [outputs.get(timeout=60)]
    while not got[-1].finished:
        got.append(outputs.get(timeout=60))
    return got


def test_the_reply_finds_the_rows_a_prefill_only_request_put_in_the_talker_cache(tiny_dir: Path) -> None:
    family = DEFAULT_REGISTRY.for_folder(tiny_dir)
    config = family.load_config(tiny_dir)
    spec = small_spec(talker_frames=16)
    graph = resolve_graph(spec, family)
    front = family.front_end(tiny_dir, config)
    options = PipelineOptions(in_process=True, talker_min_new_tokens=8)
    talkers: list[_Talker] = []

    def talker() -> _Talker:
        talkers.append(_Talker(WorkerSpec(str(tiny_dir), spec.stage("talker"))))
        return talkers[-1]

    factories = {**model_factories(str(tiny_dir), graph, options), "talker": talker}
    runtime = PipelineRuntime(graph, factories, front.tokenizer, front.audio, options)
    try:
        processor = front.processor
        assert processor is not None
        audio = (np.random.RandomState(4).randn(16000 * 3) * 0.1).astype(np.float32)
        prompt = processor.process(processor.apply_chat_template([{"role": "user", "content": [{"type": "audio"}]}]),
                                   audios=[audio])
        sampling = SamplingParams(temperature=0.0, max_tokens=1, seed=3)
        warm = _run(runtime, OmniRequest("warm", prompt, AUDIO, sampling, voice="Ethan", prefill_only=True))
        reply = _run(runtime, OmniRequest("reply", prompt, AUDIO, sampling, voice="Ethan"))
    finally:
        runtime.close()
    assert warm[-1].finish_reason in (FinishReason.STOP, FinishReason.LENGTH) and all(o.audio is None for o in warm)
    assert any(o.audio is not None for o in reply)
    (worker,) = talkers
    first, second = worker.started["warm"], worker.started["reply"]
    block = spec.stage("talker").engine.block_size
    assert first.num_cached_tokens == 0 and first.num_prompt_tokens > block
    # Every whole block of the warm request's prompt is served from the cache (the same conversation, first
    # token and voice); without it the reply would prefill them all.
    assert second.num_cached_tokens == first.num_prompt_tokens // block * block > 0
