"""A prefill-only request (``OmniRequest.prefill_only``): with audio asked, it warms the thinker and the talker and
makes no audio.

With the fake stages behind the real orchestrator and Qwen3-Omni edges: the talker gets a one-step sampling (no
floor), code2wav never sees the request, no audio comes back and it ends as its thinker and talker let it go; it
starts while the audio gate holds an ordinary audio request; aborted while the talker holds it, every stage lets
it go. The real tiny pipeline's KV blocks are ``test_prefill_only_tiny.py``'s.
"""

from __future__ import annotations

import queue
import threading
from dataclasses import dataclass, field

import pytest

from omnistage.config.pipeline import parse_pipeline
from omnistage.core import FinishReason, Modality, OmniOutput, OmniRequest
from omnistage.families.base import EdgeContext
from omnistage.families.qwen3_omni.edges import ThinkerToTalker
from omnistage.families.qwen3_omni.payloads import TalkerStart
from omnistage.families.qwen3_omni.prompt import Qwen3OmniPrompt
from omnistage.ipc.messages import StageInput, StageOutput
from omnistage.ipc.payloads import TokenDelta
from omnistage.pipeline.runtime import PipelineOptions, PipelineRuntime
from omnistage.sampling_params import SamplingParams
from omnistage.workers.base import StepResult
from tests.pipeline import fakes
from tests.pipeline.specs import small_dict
from tests.waiting import wait_until

AUDIO = frozenset({Modality.TEXT, Modality.AUDIO})
FLOOR = 8  # the talker floor an embedded random checkpoint gets: a prefill-only request must not keep it
FRAMES = 24  # the talker's configured max_tokens


def _request(rid: str, prefill_only: bool = False, max_tokens: int = 1) -> OmniRequest:
    return OmniRequest(rid, Qwen3OmniPrompt([1, 2, 3]), AUDIO, SamplingParams(max_tokens=max_tokens, seed=1),
                       prefill_only=prefill_only)


@dataclass
class _Talker(fakes.FakeTalker):
    """The fake talker, recording each start's sampling; it makes no step until ``go`` is set."""

    go: threading.Event = field(default_factory=threading.Event)
    sampling: dict[str, SamplingParams] = field(default_factory=dict)

    def handle(self, message: StageInput) -> list[StageOutput]:
        if isinstance(message.payload, TalkerStart):
            self.sampling[message.request_id] = message.payload.sampling
        return super().handle(message)

    def step(self) -> StepResult:
        if not self.go.wait(0.01):
            return StepResult([], progressed=False)
        return super().step()


class _Run:
    """The fake pipeline (gated as the preset is, the talker floor set) with its talker held until ``go``."""

    def __init__(self) -> None:
        fakes.INSTANCES.clear()
        self.go = threading.Event()
        factories = {"thinker": fakes.FakeThinker, "talker": lambda: _Talker(go=self.go),
                     "code2wav": fakes.FakeCode2Wav}
        self.runtime = PipelineRuntime(fakes.omni_graph(parse_pipeline(small_dict(talker_frames=FRAMES))),
                                       factories, None, fakes.AUDIO,
                                       PipelineOptions(in_process=True, talker_min_new_tokens=FLOOR))
        self.outputs: dict[str, queue.Queue[OmniOutput]] = {}

    def worker(self, kind: type) -> fakes.FakeBase:
        return next(w for w in fakes.INSTANCES if type(w) is kind)

    @property
    def talker(self) -> _Talker:
        return self.worker(_Talker)  # type: ignore[return-value]

    def submit(self, request: OmniRequest) -> None:
        self.outputs[request.request_id] = queue.Queue()
        self.runtime.orchestrator.submit(request, self.outputs[request.request_id].put)

    def collect(self, rid: str) -> list[OmniOutput]:
        got = [self.outputs[rid].get(timeout=20)]
        while not got[-1].finished:
            got.append(self.outputs[rid].get(timeout=20))
        return got

    def in_talker(self, rid: str) -> bool:
        return wait_until(lambda: ("TalkerStart", rid) in self.talker.seen)

    def holders(self, rid: str) -> list[str]:
        """The stages whose fake still holds ``rid``."""
        return [type(w).__name__ for w in fakes.INSTANCES if rid in w.seqs]


@pytest.fixture
def run():
    r = _Run()
    yield r
    r.go.set()
    r.runtime.close()


def test_a_prefill_only_request_has_its_talker_run_one_step_without_the_floor() -> None:
    talker = parse_pipeline(small_dict(talker_frames=FRAMES)).stage("talker")
    plain = EdgeContext(_request("a"), talker, FLOOR).stage_sampling()
    warm = EdgeContext(_request("p", prefill_only=True), talker, FLOOR).stage_sampling()
    assert (plain.max_tokens, plain.min_tokens) == (FRAMES, FLOOR)
    assert (warm.max_tokens, warm.min_tokens) == (1, 0)
    assert warm.seed == plain.seed == 1
    edge = ThinkerToTalker(EdgeContext(_request("p", prefill_only=True), talker, FLOOR))
    start, feed = edge.on_output(TokenDelta([7]), True)
    assert isinstance(start, TalkerStart) and start.sampling == warm and feed.finished


def test_a_prefill_only_audio_request_runs_the_talker_and_never_code2wav(run: _Run) -> None:
    run.go.set()
    run.submit(_request("p", prefill_only=True))
    run.submit(_request("a", max_tokens=4))  # the control: an ordinary audio request makes audio through code2wav
    warm, plain = run.collect("p"), run.collect("a")
    assert warm[-1].finish_reason is FinishReason.LENGTH and warm[-1].error is None
    assert all(o.audio is None for o in warm) and any(o.audio is not None for o in plain)
    assert [t for o in warm for t in o.token_ids] == [101]
    assert (run.talker.sampling["p"].max_tokens, run.talker.sampling["p"].min_tokens) == (1, 0)
    assert (run.talker.sampling["a"].max_tokens, run.talker.sampling["a"].min_tokens) == (FRAMES, FLOOR)
    trace = run.runtime.orchestrator.trace("p")
    assert set(trace.entered) == {"thinker", "talker"} and set(trace.left) == {"thinker", "talker"}
    code2wav = run.worker(fakes.FakeCode2Wav)
    assert not any(rid == "p" for _, rid in code2wav.seen) and any(rid == "a" for _, rid in code2wav.seen)
    assert not run.runtime.orchestrator.flows.states and not run.holders("p")


def test_a_prefill_only_request_is_not_held_by_the_audio_gate(run: _Run) -> None:
    """While stream a's talker has made no frame yet, the gate holds the next audio request b; a prefill-only p
    submitted after b starts at once and reaches the talker."""
    run.submit(_request("a", max_tokens=4))
    assert run.in_talker("a")
    run.submit(_request("b", max_tokens=4))
    run.submit(_request("p", prefill_only=True))
    assert run.in_talker("p")
    flows = run.runtime.orchestrator.flows
    assert "b" in flows.waiting and ("TalkerStart", "b") not in run.talker.seen  # the gate really is closed
    assert flows.states["p"].audio is None  # no codec stream: nothing for the gate to count
    run.go.set()
    assert all(o.audio is None for o in run.collect("p"))
    assert any(o.audio is not None for o in run.collect("a")) and any(o.audio is not None for o in run.collect("b"))


def test_aborting_a_prefill_only_request_in_the_talker_frees_every_stage(run: _Run) -> None:
    run.submit(_request("p", prefill_only=True))
    assert run.in_talker("p")
    run.runtime.orchestrator.abort("p")
    ended = run.collect("p")[-1]  # after its one text token
    assert ended.finish_reason is FinishReason.ABORT
    assert wait_until(lambda: ("abort", "p") in run.talker.seen)
    assert not run.holders("p") and not run.runtime.orchestrator.flows.states
    run.go.set()
    run.submit(_request("after", prefill_only=True))  # the pipeline still serves
    assert run.collect("after")[-1].finish_reason is FinishReason.LENGTH


def test_a_prefill_only_request_without_audio_is_an_ordinary_text_request(run: _Run) -> None:
    run.go.set()
    run.submit(OmniRequest("t", Qwen3OmniPrompt([1, 2, 3]), frozenset({Modality.TEXT}),
                           SamplingParams(max_tokens=3), prefill_only=True))
    got = run.collect("t")
    assert [t for o in got for t in o.token_ids] == [101, 102, 103] and got[-1].finish_reason is FinishReason.LENGTH
    assert set(run.runtime.orchestrator.trace("t").entered) == {"thinker"}
