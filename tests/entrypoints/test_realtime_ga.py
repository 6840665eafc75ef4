"""The Realtime GA protocol as OpenAI documents it, checked against a recorded event order, and driven with the
``openai`` SDK's realtime client (GA) and its beta spellings; function calling; G.711; truncate and delete."""

from __future__ import annotations

import asyncio
import base64
import json

import numpy as np
import openai
import pytest

from omnistage.audio.g711 import decode_g711, encode_g711
from tests.entrypoints import fixtures_realtime_ga as recorded
from tests.entrypoints.conftest import LiveServer
from tests.entrypoints.test_chat_compat import CALL_WORDS
from tests.entrypoints.test_realtime import open_session, send, spoken_like, until

TOOL = {"type": "function", "name": "get_weather", "description": "the weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}
MANUAL = {"audio": {"input": {"turn_detection": None}}}


def matches(kinds: list[str], pattern: list[str]) -> bool:
    """``kinds`` follows ``pattern``, where ``x*`` is any number of ``x``."""
    i = 0
    for step in pattern:
        if step.endswith("*"):
            while i < len(kinds) and kinds[i] == step[:-1]:
                i += 1
        elif i < len(kinds) and kinds[i] == step:
            i += 1
        else:
            return False
    return i == len(kinds)


def interleaved(kinds: list[str]) -> list[str]:
    """Audio and transcript deltas interleave; the recorded order lists each kind's run."""
    deltas = ("response.output_audio_transcript.delta", "response.output_audio.delta")
    head = [k for k in kinds if k not in deltas]
    i = head.index("response.content_part.added") + 1
    return head[:i] + sorted((k for k in kinds if k in deltas), reverse=True) + head[i:]


async def events_until(ws, kind: str) -> list[dict]:  # noqa: ANN001
    done, before = await until(ws, kind)
    return [*before, done]


def test_event_order_matches_openai_flows(server: LiveServer) -> None:
    async def scenario() -> None:
        async with await open_session(server, **MANUAL) as ws:
            await send(ws, {"type": "input_audio_buffer.append",
                            "audio": base64.b64encode(b"\0\1" * 4800).decode()})
            await send(ws, {"type": "input_audio_buffer.commit"})
            await send(ws, {"type": "response.create"})
            events = await events_until(ws, "response.done")
            kinds = [e["type"] for e in events]
            assert matches(interleaved(kinds), recorded.COMMIT_AUDIO + recorded.SPOKEN_RESPONSE), kinds
            user_id = events[0]["item_id"]
            assert events[1]["item"]["id"] == user_id and events[1]["item"]["role"] == "user"
            answer = next(e for e in events if e["type"] == "response.output_item.added")["item"]
            assert all(e.get("item_id", answer["id"]) == answer["id"] for e in events[4:] if "delta" in e["type"])
            added = [e for e in events if e["type"] == "conversation.item.added"]
            assert added[1]["previous_item_id"] == user_id  # the answer follows the user's turn
            done = events[-1]["response"]
            assert done["output"][0]["id"] == answer["id"] and done["output"][0]["status"] == "completed"

            await send(ws, {"type": "response.create", "response": {"output_modalities": ["text"]}})
            kinds = [e["type"] for e in await events_until(ws, "response.done")]
            assert matches(kinds, recorded.TEXT_RESPONSE), kinds
    asyncio.run(scenario())


def test_function_call_round_trip_and_items_keep_client_ids(server: LiveServer) -> None:
    server.engine.words = CALL_WORDS[1:]

    async def scenario() -> None:
        async with await open_session(server, tools=[TOOL], output_modalities=["text"], **MANUAL) as ws:
            await send(ws, {"type": "conversation.item.create", "item": {
                "id": "my_item_1", "type": "message", "role": "user",
                "content": [{"type": "input_text", "text": "Weather in Paris?"}]}})
            events = await events_until(ws, "conversation.item.done")
            assert [e["type"] for e in events] == recorded.CREATE_ITEM and events[0]["item"]["id"] == "my_item_1"
            await send(ws, {"type": "response.create"})
            events = await events_until(ws, "response.done")
            assert matches([e["type"] for e in events], recorded.FUNCTION_CALL_RESPONSE), [e["type"] for e in events]
            args = next(e for e in events if e["type"] == "response.function_call_arguments.done")
            assert args["name"] == "get_weather" and json.loads(args["arguments"]) == {"city": "Paris"}
            (call,) = events[-1]["response"]["output"]
            assert call["type"] == "function_call" and call["call_id"] == args["call_id"]
            server.engine.words = ("It", " is", " sunny.")
            await send(ws, {"type": "conversation.item.create", "item": {
                "type": "function_call_output", "call_id": call["call_id"], "output": '{"sky": "sunny"}'}})
            await send(ws, {"type": "response.create"})
            events = await events_until(ws, "response.done")
            assert events[-1]["response"]["output"][0]["content"][0]["text"] == "It is sunny."
    asyncio.run(scenario())
    rendered = server.engine.front_end.processor.tokenizer.decode(server.engine.requests[-1].prompt.token_ids)
    assert '"get_weather"' in rendered and '<tool_response>\n{"sky": "sunny"}\n</tool_response>' in rendered
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>' in rendered


def test_session_update_fails_only_the_bad_field(server: LiveServer) -> None:
    async def scenario() -> None:
        async with await open_session(server) as ws:
            await send(ws, {"type": "session.update", "session": {
                "type": "realtime", "instructions": "be brief", "audio": {"output": {"voice": "Nobody"},
                                                                          "input": {"turn_detection": {
                                                                              "type": "semantic_vad",
                                                                              "eagerness": "high"}}}}})
            error, _ = await until(ws, "error")
            assert error["error"]["param"] == "session.audio.output.voice"
            updated, _ = await until(ws, "session.updated")
            session = updated["session"]
            assert session["instructions"] == "be brief"
            assert session["audio"]["input"]["turn_detection"]["type"] == "semantic_vad"
            assert session["audio"]["output"]["voice"] == "Chelsie"
    asyncio.run(scenario())


def test_defaults_are_openai_defaults(server: LiveServer) -> None:
    async def scenario() -> None:
        async with await open_session(server) as ws:
            await send(ws, {"type": "session.update", "session": {"audio": {"output": {"voice": "marin"}}}})
            updated, _ = await until(ws, "session.updated")
            assert updated["session"]["audio"]["input"]["turn_detection"]["type"] == "server_vad"
            assert updated["session"]["audio"]["output"]["voice"] == "Chelsie"  # marin, mapped
    asyncio.run(scenario())


def test_g711_in_and_out_are_converted(server: LiveServer, processor) -> None:  # noqa: ANN001
    tone = spoken_like(0.5, 8000)

    async def scenario() -> None:
        async with await open_session(server, audio={"input": {"format": {"type": "audio/pcmu"},
                                                               "turn_detection": None},
                                                     "output": {"format": {"type": "audio/pcma"}}}) as ws:
            await send(ws, {"type": "input_audio_buffer.append",
                            "audio": base64.b64encode(encode_g711(tone, "ulaw")).decode()})
            await send(ws, {"type": "input_audio_buffer.commit"})
            await send(ws, {"type": "response.create"})
            events = await events_until(ws, "response.done")
            audio = b"".join(base64.b64decode(e["delta"]) for e in events if e["type"] == "response.output_audio.delta")
            wav = decode_g711(audio, "alaw")
            # The fake engine's 440 Hz tone, 0.1 s per word at 8 kHz: one byte a sample.
            assert len(audio) == 6 * 800
            spectrum = np.abs(np.fft.rfft(wav))
            assert abs(np.argmax(spectrum) * 8000 / len(wav) - 440) < 5
    asyncio.run(scenario())
    heard = processor.seen_audios[-1]
    assert len(heard) == 8000  # 0.5 s at 8 kHz, resampled to 16 kHz
    expected = np.interp(np.arange(8000) / 2, np.arange(4000), tone)
    assert np.corrcoef(heard[200:-200], expected[200:-200])[0, 1] > 0.95


def test_truncate_cuts_the_answer_and_delete_removes_items(server: LiveServer) -> None:
    async def scenario() -> None:
        async with await open_session(server, **MANUAL) as ws:
            await send(ws, {"type": "conversation.item.create", "item": {
                "id": "u1", "type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]}})
            await send(ws, {"type": "response.create"})
            done, _ = await until(ws, "response.done")
            answer = done["response"]["output"][0]["id"]
            await send(ws, {"type": "conversation.item.truncate", "item_id": answer, "content_index": 0,
                            "audio_end_ms": 200})
            truncated, _ = await until(ws, "conversation.item.truncated")
            assert truncated["audio_end_ms"] == 200
            await send(ws, {"type": "conversation.item.retrieve", "item_id": answer})
            got, _ = await until(ws, "conversation.item.retrieved")
            assert got["item"]["content"][0]["transcript"] == "Hello"  # 200 of 600 ms heard
            await send(ws, {"type": "conversation.item.delete", "item_id": "u1"})
            deleted, _ = await until(ws, "conversation.item.deleted")
            assert deleted["item_id"] == "u1"
            await send(ws, {"type": "conversation.item.truncate", "item_id": answer, "audio_end_ms": 10_000})
            error, _ = await until(ws, "error")
            assert error["error"]["param"] == "audio_end_ms"
    asyncio.run(scenario())


def test_openai_sdk_realtime_ga(server: LiveServer) -> None:
    async def scenario() -> None:
        client = openai.AsyncOpenAI(base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0)
        async with client.realtime.connect(model="fake-omni") as conn:
            await conn.session.update(session={"type": "realtime", "output_modalities": ["text"], "tools": [TOOL],
                                               "audio": {"input": {"turn_detection": None}}})
            await conn.conversation.item.create(item={"type": "message", "role": "user",
                                                      "content": [{"type": "input_text", "text": "Weather?"}]})
            await conn.response.create()
            kinds = []
            async for event in conn:
                kinds.append(event.type)
                if event.type == "response.function_call_arguments.done":
                    assert event.name == "get_weather"
                if event.type == "response.done":
                    assert event.response.output[0].type == "function_call"
                    break
            assert "response.function_call_arguments.done" in kinds and "conversation.item.done" in kinds
    server.engine.words = CALL_WORDS[1:]
    asyncio.run(asyncio.wait_for(scenario(), 20))


def test_beta_clients_get_beta_event_names(server: LiveServer) -> None:
    from websockets.asyncio.client import connect

    from tests.entrypoints.test_realtime import recv, ws_url

    async def scenario() -> None:
        async with connect(ws_url(server), additional_headers={"OpenAI-Beta": "realtime=v1"}) as ws:
            created = await recv(ws)
            assert created["session"]["input_audio_format"] == "pcm16"
            await send(ws, {"type": "session.update", "session": {"modalities": ["text", "audio"],
                                                                  "turn_detection": None, "voice": "alloy"}})
            await until(ws, "session.updated")
            await send(ws, {"type": "conversation.item.create", "item": {
                "type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]}})
            await until(ws, "conversation.item.created")
            await send(ws, {"type": "response.create"})
            events = await events_until(ws, "response.done")
            kinds = {e["type"] for e in events}
            assert {"response.audio.delta", "response.audio_transcript.delta", "response.audio.done"} <= kinds
            assert not any(k.startswith("response.output_audio") or k == "conversation.item.done" for k in kinds)
            part = next(e for e in events if e["type"] == "response.content_part.added")["part"]
            assert part["type"] == "audio"
    asyncio.run(scenario())


@pytest.mark.parametrize(("eagerness", "longest_ms"), [("low", 8000), ("medium", 4000), ("auto", 4000),
                                                      ("high", 2000)])
def test_semantic_vad_eagerness_sets_the_longest_wait(eagerness: str, longest_ms: int) -> None:
    """OpenAI's documented maxima (low ~8 s, medium ~4 s, high ~2 s, auto is medium): the silence that ends a turn
    the classifier judged incomplete; the classifier is first asked after 100 ms (then as the silence doubles)."""
    from omnistage.entrypoints.openai.realtime.protocol import SessionConfig, update_session

    config, errors = update_session(SessionConfig(), {"session": {"audio": {"input": {"turn_detection": {
        "type": "semantic_vad", "eagerness": eagerness}}}}})
    assert not errors and config.turn_detection.vad.silence_duration_ms == longest_ms
    assert config.turn_detection.vad.judge_ms == 100 and config.turn_detection.semantic
