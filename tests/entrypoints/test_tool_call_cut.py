"""A tool call cut off by the token limit is never shown or spoken: chat completions (whole and streamed) end with
``finish_reason: "length"`` and only the text before the call; a realtime response ends ``incomplete``
(``max_output_tokens``) with no half-written call in its text or transcript."""

from __future__ import annotations

import asyncio

import pytest

from omnistage.entrypoints.openai.common.tool_calls import OPEN, ToolCallParser
from tests.entrypoints.conftest import LiveServer
from tests.entrypoints.test_chat_compat import CALL_WORDS, TOOLS, USER
from tests.entrypoints.test_realtime import open_session, send, until
from tests.entrypoints.test_realtime_ga import TOOL

NAMED = {"type": "function", "function": {"name": "get_weather"}}
FORCED_WORDS = ('{"city": ', '"Ro', 'me"}}', "\n</tool_call>")  # what follows the forced call's opening


def test_parser_drops_an_unclosed_call_that_does_not_parse() -> None:
    parser = ToolCallParser()
    shown, _ = parser.feed('Let me check.\n<tool_call>\n{"name": "get_weather", "argu')
    tail, calls = parser.finish()
    assert shown + tail == "Let me check." and calls == []
    forced = ToolCallParser(prefix=OPEN + '\n{"name": "get_weather", "arguments": ')
    assert forced.feed('{"city": "Ro') == ("", []) and forced.finish() == ("", [])
    # Unchanged: a closed call that is not JSON stays content; an unclosed one that parses is a call.
    closed = ToolCallParser()
    assert closed.feed("<tool_call>not json</tool_call>")[0] == "<tool_call>not json</tool_call>"
    whole = ToolCallParser()
    whole.feed('<tool_call>{"name": "f", "arguments": {}}')
    assert [c.name for c in whole.finish()[1]] == ["f"]


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("choice", ["auto", "named"])
def test_chat_completion_cut_inside_a_call(server: LiveServer, stream: bool, choice: str) -> None:
    named = choice == "named"
    server.engine.words = FORCED_WORDS if named else CALL_WORDS
    kwargs = {"model": "fake-omni", "messages": USER, "tools": TOOLS, "max_tokens": 2 if named else 3,
              "tool_choice": NAMED if named else "auto"}
    if not stream:
        choice_ = server.client().chat.completions.create(**kwargs).choices[0]
        content, calls, reason = choice_.message.content, choice_.message.tool_calls, choice_.finish_reason
    else:
        chunks = [c for c in server.client().chat.completions.create(**kwargs, stream=True) if c.choices]
        content = "".join(c.choices[0].delta.content or "" for c in chunks)
        calls = [tc for c in chunks for tc in c.choices[0].delta.tool_calls or []]
        reason = chunks[-1].choices[0].finish_reason
    assert reason == "length" and not calls
    assert (content or "") == ("" if named else "Let me check.")


@pytest.mark.parametrize("choice", ["auto", "named"])
def test_realtime_response_cut_inside_a_call_is_incomplete(server: LiveServer, choice: str) -> None:
    named = choice == "named"
    server.engine.words = FORCED_WORDS if named else CALL_WORDS

    async def scenario() -> tuple[dict, list[dict]]:
        async with await open_session(server, tools=[TOOL], audio={"input": {"turn_detection": None}}) as ws:
            await send(ws, {"type": "conversation.item.create", "item": {
                "type": "message", "role": "user", "content": [{"type": "input_text", "text": "Weather?"}]}})
            await send(ws, {"type": "response.create", "response": {
                "max_output_tokens": 2 if named else 3,
                "tool_choice": {"type": "function", "name": "get_weather"} if named else "auto"}})
            return await until(ws, "response.done")

    done, events = asyncio.run(scenario())
    response = done["response"]
    assert response["status"] == "incomplete"
    assert response["status_details"] == {"type": "incomplete", "reason": "max_output_tokens"}
    said = "".join(e.get("delta", "") for e in events if e["type"] == "response.output_audio_transcript.delta")
    assert said == ("" if named else "Let me check.")
    assert not any(e["type"].startswith("response.function_call") for e in events)
    # Only a message (the fake engine speaks every delta, so even the forced call's answer has one), saying no more.
    assert [o["type"] for o in response["output"]] == ["message"]
    assert response["output"][0]["content"][0]["transcript"] == said
    assert server.engine.requests[-1].unspoken is not None  # the talker skips the call's span too
