"""More input for a running request (text still being written) reaches its entry stage through the family's
``entry_feed``, after the request's start and in order: held while the audio gate holds the request, dropped once
the request ended, counted in its prompt tokens; a delta the family refuses fails that request alone. While its
input is open its talker runs at the writer's pace, which the audio gate must not read as the talker's."""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace

import msgspec

from omnistage.config.pipeline import parse_pipeline
from omnistage.core import FinishReason, Modality, OmniOutput, OmniRequest
from omnistage.ipc.messages import AbortRequests, PayloadTypes, StageInput
from omnistage.pipeline.detokenizer import IncrementalDetokenizer
from omnistage.pipeline.flow import FlowSettings, RequestFlows
from omnistage.pipeline.graph import resolve_graph
from omnistage.pipeline.playback import Playback
from omnistage.pipeline.request_state import RequestState
from omnistage.pipeline.router import StageRouter
from tests.pipeline.toy_family import SPEC, LettersStart, ToneFeed, ToyFamily, ToyPrompt


@dataclass(frozen=True)
class MoreLetters:
    count: int
    done: bool = False

    @property
    def num_tokens(self) -> int:
        return self.count


class LettersMore(msgspec.Struct, tag="toy.LettersMore"):
    count: int


class FedToyFamily(ToyFamily):
    payloads = PayloadTypes((LettersStart, ToneFeed, LettersMore))

    def entry_feed(self, delta: object) -> LettersMore:
        if not isinstance(delta, MoreLetters):
            raise TypeError(f"toy takes MoreLetters, not {type(delta).__name__}")
        return LettersMore(delta.count)


def _flows() -> tuple[RequestFlows, list[tuple[str, object]]]:
    graph = resolve_graph(parse_pipeline(SPEC), FedToyFamily())
    sent: list[tuple[str, object]] = []
    routers = {s: StageRouter(s, 1) for s in ("writer", "speaker")}
    flows = RequestFlows(FlowSettings(graph, None), routers, lambda stage, index, m: sent.append((stage, m)), None)
    return flows, sent


def _inputs(sent: list[tuple[str, object]]) -> list[object]:
    return [m.payload for stage, m in sent if stage == "writer" and isinstance(m, StageInput)]


def test_feeds_follow_the_start_in_order_and_count_as_prompt_tokens() -> None:
    flows, sent = _flows()
    outputs: list[OmniOutput] = []
    flows.submit(OmniRequest("r", ToyPrompt(2), frozenset({Modality.TEXT}), open_input=True), outputs.append)
    flows.feed("r", MoreLetters(3))
    assert flows.states["r"].input_open  # its pace is the writer's until its input ends
    flows.feed("r", MoreLetters(4, done=True))
    assert _inputs(sent) == [LettersStart(2), LettersMore(3), LettersMore(4)]
    assert flows.states["r"].num_prompt_tokens == 1 + 3 + 4 and not flows.states["r"].input_open
    flows.fail("r", None, FinishReason.ABORT)
    flows.feed("r", MoreLetters(5))  # ended: nothing more is sent
    assert _inputs(sent)[-1] == LettersMore(4) and outputs[-1].usage.prompt_tokens == 8


def test_feeds_to_a_held_request_go_after_its_start_and_die_with_it() -> None:
    flows, sent = _flows()
    request = OmniRequest("held", ToyPrompt(2), frozenset({Modality.TEXT}))
    flows.waiting["held"] = (request, lambda out: None, 0.0)  # as the audio gate holds one
    flows.feed("held", MoreLetters(3))
    assert _inputs(sent) == []
    flows.waiting.pop("held")
    flows._start(request, lambda out: None)
    assert _inputs(sent) == [LettersStart(2), LettersMore(3)]
    flows.waiting["gone"] = (OmniRequest("gone", ToyPrompt(1)), lambda out: None, 0.0)
    flows.feed("gone", MoreLetters(1))
    flows.fail("gone", None, FinishReason.ABORT)
    assert "gone" not in flows.held_feeds


def test_a_delta_the_family_refuses_fails_its_request_alone() -> None:
    flows, sent = _flows()
    outputs: list[OmniOutput] = []
    flows.submit(OmniRequest("r", ToyPrompt(2), frozenset({Modality.TEXT})), outputs.append)
    flows.submit(OmniRequest("other", ToyPrompt(2), frozenset({Modality.TEXT})), lambda out: None)
    flows.feed("r", "not a delta")
    assert outputs[-1].finish_reason is FinishReason.ERROR and "MoreLetters" in outputs[-1].error
    assert any(isinstance(m, AbortRequests) for _, m in sent) and "other" in flows.states


def test_a_stream_whose_input_is_open_is_counted_by_the_gate_but_not_measured() -> None:
    flows, _ = _flows()
    audio = SimpleNamespace(done=False, talker_done=False, planner=SimpleNamespace(talker=SimpleNamespace(value=0.05)),
                            playback=Playback())
    for rid, open_input in (("open", True), ("closed", False)):
        flows.states[rid] = RequestState(OmniRequest(rid, ToyPrompt(1)), lambda out: None,
                                         IncrementalDetokenizer(None), input_open=open_input, audio=audio)
    assert [(load.talking, load.talker_frame_s) for load in flows._stream_loads()] == [(True, None), (True, 0.05)]


def test_the_gates_light_walk_records_what_its_full_walk_would() -> None:
    """With no request waiting the gate only records the talker's pace: the lighter walk gives the talking
    streams' paces exactly as the loads do (a stream whose talker ended and one still decoding are left out)."""
    flows, _ = _flows()

    def audio(talker_done: bool, done: bool, pace: float | None) -> SimpleNamespace:
        return SimpleNamespace(done=done, talker_done=talker_done, playback=Playback(),
                               planner=SimpleNamespace(talker=SimpleNamespace(value=pace)))

    streams = {"open": (True, audio(False, False, 0.05)), "talking": (False, audio(False, False, 0.07)),
               "new": (False, audio(False, False, None)), "decoding": (False, audio(True, False, 0.09)),
               "done": (False, audio(True, True, 0.04)), "text": (False, None)}
    for rid, (open_input, edge) in streams.items():
        flows.states[rid] = RequestState(OmniRequest(rid, ToyPrompt(1)), lambda out: None,
                                         IncrementalDetokenizer(None), input_open=open_input, audio=edge)
    full = [load.talker_frame_s for load in flows._stream_loads() if load.talking]
    assert flows._talker_paces() == full == [None, 0.07, None]
