"""Qwen2.5-Omni's serving pieces one at a time: the thinker worker sends its captured rows before each token
output (equal to the offline capture), the thinker → talker edge starts and feeds the talker as rows arrive, the
talker worker keeps every code when it stops at max tokens and cuts at the first pad/eos."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from omnistage.config.pipeline import load_pipeline
from omnistage.core import Modality, OmniRequest, UnspokenSpan
from omnistage.engine import FinishReason, RequestOutput
from omnistage.families.base import EdgeContext
from omnistage.families.qwen2_5_omni.edges import ThinkerToTalker
from omnistage.families.qwen2_5_omni.family import PRESET
from omnistage.families.qwen2_5_omni.payloads import ReplyFeed, ReplyHidden, TalkerStart, ThinkerPrompt
from omnistage.families.qwen2_5_omni.prompt import Qwen25OmniPrompt
from omnistage.families.qwen2_5_omni.thinker_hook import HiddenCapture
from omnistage.families.qwen2_5_omni.thinker_stage import build_thinker_request
from omnistage.families.qwen2_5_omni.workers import TalkerWorker, ThinkerWorker
from omnistage.ipc.messages import StageInput
from omnistage.ipc.payloads import TokenDelta
from omnistage.models.qwen2_5_omni.inputs import OmniInputs
from omnistage.sampling_params import SamplingParams
from omnistage.workers.base import WorkerSpec
from tests.families.qwen2_5_omni.conftest import TAIL, TEXT

SPEC = load_pipeline(PRESET)
GREEDY = SamplingParams(temperature=0.0, max_tokens=6)


def test_thinker_sends_captured_rows_before_each_token_output(omni25_dir: Path) -> None:
    worker = ThinkerWorker(WorkerSpec(str(omni25_dir), SPEC.stage("thinker")))
    ids = TEXT + TAIL
    worker.handle(StageInput("r", ThinkerPrompt(ids, GREEDY, capture_hidden=True)))
    outputs = []
    while worker.has_work():
        outputs += worker.step().outputs
    kinds = [type(o.payload).__name__ for o in outputs]
    assert kinds == ["ReplyHidden", "TokenDelta"] * 6
    rows = torch.cat([o.payload.rows for o in outputs if isinstance(o.payload, ReplyHidden)])
    assert rows.shape[0] == len(ids) + 6 - 1  # the last token is never fed back
    request = build_thinker_request(worker.model, "o", ids, OmniInputs(), GREEDY, None, capture=True)
    engine = worker.engine
    engine.add_request(request)
    engine.run_until_done()
    assert isinstance(request.stage_data, HiddenCapture)
    torch.testing.assert_close(rows, request.stage_data.drain()[:rows.shape[0]], atol=1e-5, rtol=0)
    plain = ThinkerPrompt(ids, GREEDY)
    worker.handle(StageInput("plain", plain))
    while worker.has_work():
        assert not any(isinstance(o.payload, ReplyHidden) for o in worker.step().outputs)


def _edge(prompt_len: int, sampling_seed: int | None = 5, unspoken: UnspokenSpan | None = None) -> ThinkerToTalker:
    from omnistage.sampling_params import SamplingParams

    request = OmniRequest("r", Qwen25OmniPrompt(list(range(prompt_len))), frozenset({Modality.TEXT, Modality.AUDIO}),
                          SamplingParams(seed=sampling_seed), voice="Ethan", unspoken=unspoken)
    return ThinkerToTalker(EdgeContext(request, SPEC.stage("talker")))


def test_edge_starts_on_the_first_tokens_row_and_feeds_each_later_row() -> None:
    p, h = 4, 3
    edge = _edge(p)
    rows = torch.arange((p + 4) * h, dtype=torch.float32).view(-1, h)
    assert edge.on_output(ReplyHidden(rows[:p]), False) == []
    assert edge.on_output(TokenDelta([10], p), False) == []  # gen 0 has no row yet
    assert edge.on_output(ReplyHidden(rows[p:p + 1]), False) == []
    start, = edge.on_output(TokenDelta([11], p), False)
    assert isinstance(start, TalkerStart) and start.first_token == 10 and start.voice == "Ethan"
    assert torch.equal(start.prompt_hidden, rows[:p]) and torch.equal(start.first_hidden, rows[p])
    assert start.sampling.top_k == 40 and start.sampling.seed == 5
    feed, = edge.on_output(ReplyHidden(rows[p + 1:p + 3]), False)  # 11 and its row: fed at once
    assert feed.token_ids == [11] and torch.equal(feed.hidden, rows[p + 1:p + 2]) and not feed.finished
    feed, = edge.on_output(TokenDelta([12, 13], p), False)
    assert feed.token_ids == [12] and torch.equal(feed.hidden, rows[p + 2:p + 3])
    end, = edge.on_output(TokenDelta([14], p), True)  # 13's row comes with 14's output: never, 14 is last
    assert isinstance(end, ReplyFeed) and end.token_ids == [] and end.hidden is None and end.finished
    assert edge.on_output(TokenDelta([15], p), True) == []


def test_tool_calls_are_not_spoken() -> None:
    p, h, call = 2, 3, UnspokenSpan(open_id=90, close_id=91)
    edge = _edge(p, unspoken=call)
    rows = torch.arange((p + 9) * h, dtype=torch.float32).view(-1, h)  # the last token has no row
    tokens = [90, 5, 91, 10, 11, 90, 6, 91, 12, 13]  # a call, "10 11", another call, "12 13"
    out = edge.on_output(ReplyHidden(rows), False) + edge.on_output(TokenDelta(tokens[:9], p), False)
    out += edge.on_output(TokenDelta(tokens[9:], p), True)
    start, *feeds = out
    assert isinstance(start, TalkerStart) and start.first_token == 10 and torch.equal(start.first_hidden, rows[p + 3])
    assert torch.equal(start.prompt_hidden, rows[:p])
    assert [t for f in feeds for t in f.token_ids] == [11, 12]  # 13 is the last token: never fed
    assert torch.equal(torch.cat([f.hidden for f in feeds if f.hidden is not None]), rows[[p + 4, p + 8]])
    assert feeds[-1].finished
    assert _edge(p, unspoken=call).on_output(TokenDelta([90, 5, 91], p), True) == []  # only a call: no audio


def test_a_reply_of_one_token_gets_no_audio() -> None:
    edge = _edge(2)
    assert edge.on_output(ReplyHidden(torch.zeros(2, 3)), False) == []
    assert edge.on_output(TokenDelta([7], 2), True) == []


@pytest.fixture(scope="module")
def talker(omni25_dir: Path) -> TalkerWorker:
    return TalkerWorker(WorkerSpec(str(omni25_dir), SPEC.stage("talker")))


@pytest.mark.parametrize(("last", "reason", "kept"), ((9, FinishReason.LENGTH, 3), (None, FinishReason.STOP, 2)))
def test_talker_keeps_codes_at_max_tokens_and_cuts_at_a_stop_code(talker: TalkerWorker, last: int | None,
                                                                   reason: FinishReason, kept: int) -> None:
    stop = talker.ctx.stop_codes[0] if last is None else last
    out = RequestOutput("r", [stop], finished=True, finish_reason=reason,
                        new_frames=torch.tensor([[1], [2], [stop]]))
    talker.engine.step = lambda: [out]  # type: ignore[method-assign]
    try:
        frames = talker.step().outputs[0].payload
    finally:
        del talker.engine.step
    assert frames.frames.shape == (kept, 1)
