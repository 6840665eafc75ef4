"""Conversation truncation as OpenAI's Realtime API does it, on a long scripted session against a fake engine with a
small context: ``auto`` drops the oldest items just enough and keeps answering; ``retention_ratio`` drops more at
once, so it truncates less often; ``disabled`` fails when the prompt no longer fits. The instructions stay."""

from __future__ import annotations

import asyncio
import re

import pytest
from websockets.asyncio.client import connect

from omnistage.entrypoints.openai.realtime.truncation import Truncation, fit_prompt, parse_truncation
from tests.entrypoints.conftest import LiveServer
from tests.entrypoints.realtime_validators import sdk_problems
from tests.entrypoints.test_realtime import spoken_like, ws_url
from tests.entrypoints.test_realtime_schemas import RATE, Recorder

CONTEXT = 600  # the response keeps a quarter: prompts may hold 450 tokens
TURNS = 24
INSTRUCTIONS = "You are terse. Keep every answer short."


async def long_session(server: LiveServer, truncation: object) -> tuple[list[dict], Recorder]:
    async with connect(ws_url(server)) as ws:
        s = Recorder(ws)
        outcomes = await converse(s, truncation)
        await s.send({"type": "conversation.item.retrieve", "item_id": "u00"})
        await s.send({"type": "conversation.item.retrieve", "item_id": f"u{TURNS - 1:02d}"})
        outcomes.append(await s.until("conversation.item.retrieved"))
        return outcomes, s


async def converse(s: Recorder, truncation: object) -> list[dict]:
    """``TURNS`` text turns and their answers; each turn's outcome."""
    await s.until("session.created")
    await s.update({"type": "realtime", "output_modalities": ["text"], "instructions": INSTRUCTIONS,
                    "truncation": truncation, "audio": {"input": {"turn_detection": None}}})
    outcomes = []
    for turn in range(TURNS):
        await s.say(f"marker{turn:02d} tell me something about the weather and the sea today", id=f"u{turn:02d}")
        await s.send({"type": "response.create"})
        outcomes.append(await _outcome(s))
    return outcomes


async def _outcome(s: Recorder) -> dict:
    """The turn's ``response.done``, or the ``error`` that refused it."""
    return await s.until("response.done", "error")


def kept_markers(server: LiveServer) -> list[list[int]]:
    """For each request the engine saw, the user turns its prompt still holds."""
    tokenizer = server.engine.front_end.processor.tokenizer
    return [[int(m) for m in re.findall(r"marker(\d\d)", tokenizer.decode(r.prompt.token_ids))]
            for r in server.engine.requests]


@pytest.fixture()
def small_context(server: LiveServer, monkeypatch: pytest.MonkeyPatch) -> LiveServer:
    monkeypatch.setattr(server.engine, "max_model_len", CONTEXT)
    return server


def run_session(server: LiveServer, truncation: object) -> tuple[list[dict], list[dict]]:
    outcomes, recorder = asyncio.run(long_session(server, truncation))
    errors = [e for e in recorder.events if e["type"] == "error"]
    assert sdk_problems(recorder.events) == []  # the truncation setting as the session reports it, too
    return outcomes, errors


def test_auto_drops_the_oldest_items_and_keeps_answering(small_context: LiveServer) -> None:
    server = small_context
    outcomes, errors = run_session(server, "auto")
    assert [o["response"]["status"] for o in outcomes[:TURNS]] == ["completed"] * TURNS
    kept = kept_markers(server)
    assert len(kept) == TURNS and kept[-1][-1] == TURNS - 1  # every turn answered, the newest turn in its prompt
    assert kept[0] == [0] and kept[-1][0] > 0  # the oldest turns were dropped...
    assert all(k == list(range(k[0], k[-1] + 1)) for k in kept)  # ...only the oldest, in order
    assert all(len(r.prompt.token_ids) <= CONTEXT * 3 // 4 for r in server.engine.requests)
    tokenizer = server.engine.front_end.processor.tokenizer
    assert all(INSTRUCTIONS in tokenizer.decode(r.prompt.token_ids) for r in server.engine.requests)
    # Dropped from the session too: retrieving the first turn fails, the last one is there.
    assert [e["error"]["code"] for e in errors] == ["item_not_found"]
    assert outcomes[-1]["item"]["id"] == f"u{TURNS - 1:02d}"
    # auto drops just enough: once truncating, every prompt is within one turn (a user item and its answer) of
    # the limit.
    lengths = [len(r.prompt.token_ids) for r in server.engine.requests]
    turn = lengths[1] - lengths[0]
    first_cut = next(i for i, k in enumerate(kept) if k[0] > 0)
    assert first_cut < TURNS // 2 and all(n > CONTEXT * 3 // 4 - turn for n in lengths[first_cut:])


def test_streaming_input_prefills_are_fitted_as_the_response_is(small_context: LiveServer) -> None:
    """A spoken turn after a long conversation: the prefill streaming input sends while the user speaks drops the
    same oldest items the response will (it was sent whole, past the context: the engine refused it)."""
    server = small_context

    async def scenario() -> dict:
        async with connect(ws_url(server)) as ws:
            s = Recorder(ws)
            await converse(s, "auto")
            await s.update({"type": "realtime", "streaming_input": True})
            await s.stream(spoken_like(0.6, RATE, seed=3))
            await s.send({"type": "input_audio_buffer.commit"})
            await s.send({"type": "response.create"})
            return await _outcome(s)

    done = asyncio.run(scenario())
    assert done["response"]["status"] == "completed"
    prefills = [r for r in server.engine.requests if r.request_id.startswith("prefill")]
    assert prefills, "streaming input sent no prefill"
    limit = CONTEXT * 3 // 4
    assert all(len(r.prompt.token_ids) <= limit for r in prefills), [len(r.prompt.token_ids) for r in prefills]
    kept = kept_markers(server)
    assert kept[-2][0] > 0 and kept[-2][-1] == TURNS - 1  # the prefill: the oldest turns left out, the newest kept


def test_retention_ratio_drops_more_at_once_so_it_truncates_less_often(small_context: LiveServer) -> None:
    server = small_context
    _, _ = run_session(server, "auto")
    auto = kept_markers(server)
    server.engine.requests.clear()
    outcomes, _ = run_session(server, {"type": "retention_ratio", "retention_ratio": 0.5})
    assert [o["response"]["status"] for o in outcomes[:TURNS]] == ["completed"] * TURNS
    ratio = kept_markers(server)

    def cuts(kept: list[list[int]]) -> int:
        return sum(1 for a, b in zip(kept, kept[1:]) if b[0] > a[0])

    assert 0 < cuts(ratio) < cuts(auto)
    assert min(len(k) for k in ratio[TURNS // 2:]) < min(len(k) for k in auto[TURNS // 2:])


def test_disabled_fails_once_the_prompt_is_past_the_context(small_context: LiveServer) -> None:
    outcomes, errors = run_session(small_context, "disabled")
    assert errors and errors[0]["error"]["code"] == "context_length_exceeded"
    assert kept_markers(small_context)[-1][0] == 0  # nothing was ever dropped


def test_truncation_setting_is_parsed_and_described() -> None:
    assert parse_truncation("auto") == Truncation()
    ratio = parse_truncation({"type": "retention_ratio", "retention_ratio": 0.8,
                              "token_limits": {"post_instructions": 300}})
    assert ratio.describe() == {"type": "retention_ratio", "retention_ratio": 0.8,
                                "token_limits": {"post_instructions": 300}}
    for bad in ("sometimes", {"type": "retention_ratio", "retention_ratio": 2},
                {"type": "retention_ratio", "retention_ratio": 0.5, "token_limits": {"post_instructions": 0}}):
        with pytest.raises(ValueError):
            parse_truncation(bad)


def test_a_dropped_call_takes_its_output_along() -> None:
    from omnistage.entrypoints.openai.realtime.items import Item

    items = (Item("u", "message", role="user", text="x" * 50), Item("c", "function_call", call_id="1", name="f"),
             Item("o", "function_call_output", call_id="1", output="y" * 50),
             Item("a", "message", role="assistant", text="z" * 10))

    class Prompt:
        def __init__(self, n: int) -> None:
            self.token_ids = range(n)

    async def render(kept: tuple) -> Prompt:
        return Prompt(sum(len(i.text) + len(i.output) for i in kept))

    prompt, dropped = asyncio.run(fit_prompt(items, render, Truncation(), limit=55))
    assert dropped == 3 and len(prompt.token_ids) == 10  # never starts at the call's output
