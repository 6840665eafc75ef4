"""Parallel tool calls in one realtime response: each call the model makes is its own ``function_call`` item (its
own ``call_id`` and ``output_index``) in one ``response.done``, and both outputs reach the next prompt."""

from __future__ import annotations

import asyncio
import json

from tests.entrypoints.conftest import LiveServer
from tests.entrypoints.test_chat_compat import CALL_WORDS
from tests.entrypoints.test_realtime import open_session, send
from tests.entrypoints.test_realtime_ga import MANUAL, TOOL, events_until

ROME = ("\n<tool_call>", '\n{"name": "get_weather", ', '"arguments": {"city": "Rome"}}', "\n</tool_call>")


def test_two_calls_in_one_response_are_two_items_answered_together(server: LiveServer) -> None:
    server.engine.words = CALL_WORDS[1:] + ROME

    async def scenario() -> None:
        async with await open_session(server, tools=[TOOL], output_modalities=["text"], **MANUAL) as ws:
            await send(ws, {"type": "conversation.item.create", "item": {
                "type": "message", "role": "user", "content": [{"type": "input_text", "text": "Paris and Rome?"}]}})
            await send(ws, {"type": "response.create"})
            events = await events_until(ws, "response.done")
            done = [e for e in events if e["type"] == "response.function_call_arguments.done"]
            assert [json.loads(e["arguments"])["city"] for e in done] == ["Paris", "Rome"]
            assert [e["output_index"] for e in done] == [0, 1] and done[0]["call_id"] != done[1]["call_id"]
            output = events[-1]["response"]["output"]
            assert [o["type"] for o in output] == ["function_call", "function_call"]
            assert [o["call_id"] for o in output] == [e["call_id"] for e in done]
            server.engine.words = ("Both", " sunny.")
            for call, sky in zip(output, ("sunny", "clear")):
                await send(ws, {"type": "conversation.item.create", "item": {
                    "type": "function_call_output", "call_id": call["call_id"], "output": json.dumps({"sky": sky})}})
            await send(ws, {"type": "response.create"})
            events = await events_until(ws, "response.done")
            assert events[-1]["response"]["output"][0]["content"][0]["text"] == "Both sunny."
    asyncio.run(scenario())
    rendered = server.engine.front_end.processor.tokenizer.decode(server.engine.requests[-1].prompt.token_ids)
    for city in ("Paris", "Rome"):  # both calls in the assistant's turn, as the model made them
        assert f'<tool_call>\n{{"name": "get_weather", "arguments": {{"city": "{city}"}}}}\n</tool_call>' in rendered
    assert '<tool_response>\n{"sky": "sunny"}\n</tool_response>' in rendered
    assert '<tool_response>\n{"sky": "clear"}\n</tool_response>' in rendered
