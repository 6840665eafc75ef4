"""Every server event a realtime session sends, read by OpenAI's own clients: the ``openai`` SDK's GA union (and
its beta union for a beta session) and openai-agents' realtime model, which reports an event it cannot read as an
``error``. The sessions cover what a voice agent does: text and spoken turns, server VAD with input transcription,
a function call round trip, cancel and barge-in, item create/retrieve/truncate/delete, errors, a turn cut at
``max_output_tokens``, both protocols. Then openai-agents' ``RealtimeRunner`` drives the server itself."""

from __future__ import annotations

import asyncio
import base64
import json
from typing import Any

import numpy as np
import pytest
from websockets.asyncio.client import ClientConnection, connect

from tests.audio.signals import speech_like
from tests.entrypoints.conftest import LiveServer
from tests.entrypoints.realtime_validators import agents_problems, sdk_problems
from tests.entrypoints.test_chat_compat import CALL_WORDS
from tests.entrypoints.test_realtime import TIMEOUT_S, pcm16_pieces, ws_url

TOOL = {"type": "function", "name": "get_weather", "description": "the weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}
RATE = 24000  # OpenAI's one PCM rate (16 kHz, our extension, is outside the SDK's schema: see the last test)


class Recorder:
    """A realtime socket that keeps every server event it reads."""

    def __init__(self, ws: ClientConnection) -> None:
        self.ws = ws
        self.events: list[dict[str, Any]] = []

    async def send(self, event: dict[str, Any]) -> None:
        await self.ws.send(json.dumps(event))

    async def until(self, *kinds: str) -> dict[str, Any]:
        """The next event of one of ``kinds`` (every event read on the way is kept)."""
        while True:
            event = json.loads(await asyncio.wait_for(self.ws.recv(), TIMEOUT_S))
            self.events.append(event)
            if event["type"] in kinds:
                return event

    async def update(self, session: dict[str, Any]) -> dict[str, Any]:
        await self.send({"type": "session.update", "session": session})
        return await self.until("session.updated")

    async def say(self, text: str, **item: Any) -> None:
        await self.send({"type": "conversation.item.create", "item": {
            "type": "message", "role": "user", "content": [{"type": "input_text", "text": text}], **item}})

    async def stream(self, samples: np.ndarray) -> None:
        for piece in pcm16_pieces(samples, RATE):
            await self.send({"type": "input_audio_buffer.append", "audio": piece})


async def recorded(server: LiveServer, scenario, beta: bool = False) -> list[dict[str, Any]]:  # noqa: ANN001
    headers = {"OpenAI-Beta": "realtime=v1"} if beta else {}
    async with connect(ws_url(server), additional_headers=headers) as ws:
        session = Recorder(ws)
        await session.until("session.created")
        await scenario(session)
        return session.events


# -- GA sessions --------------------------------------------------------------------------------------------------
async def text_turn_and_items(s: Recorder) -> None:
    await s.update({"type": "realtime", "output_modalities": ["text"], "instructions": "be brief",
                    "audio": {"input": {"turn_detection": None}}})
    await s.say("hi", id="u1")
    await s.until("conversation.item.done")
    await s.send({"type": "response.create", "response": {"metadata": {"topic": "greeting"}}})
    done = await s.until("response.done")
    answer = done["response"]["output"][0]["id"]
    await s.send({"type": "conversation.item.retrieve", "item_id": answer})
    await s.until("conversation.item.retrieved")
    await s.send({"type": "conversation.item.retrieve", "item_id": "u1"})
    await s.until("conversation.item.retrieved")
    await s.send({"type": "response.create", "response": {"conversation": "none", "output_modalities": ["text"],
                                                          "input": [{"type": "message", "role": "user", "content": [
                                                              {"type": "input_text", "text": "aside"}]}]}})
    await s.until("response.done")
    await s.send({"type": "conversation.item.delete", "item_id": "u1"})
    await s.until("conversation.item.deleted")


async def spoken_turn_truncated(s: Recorder) -> None:
    await s.update({"type": "realtime", "audio": {"input": {"turn_detection": None}}})
    await s.stream(speech_like(0.5, RATE))
    await s.send({"type": "input_audio_buffer.commit"})
    await s.until("input_audio_buffer.committed")
    await s.send({"type": "response.create"})
    done = await s.until("response.done")
    answer = done["response"]["output"][0]["id"]
    await s.send({"type": "conversation.item.truncate", "item_id": answer, "content_index": 0, "audio_end_ms": 200})
    await s.until("conversation.item.truncated")
    await s.send({"type": "conversation.item.retrieve", "item_id": answer})
    await s.until("conversation.item.retrieved")
    await s.send({"type": "input_audio_buffer.append", "audio": base64.b64encode(b"\0\0" * 160).decode()})
    await s.send({"type": "input_audio_buffer.clear"})
    await s.until("input_audio_buffer.cleared")


async def vad_turn_with_transcription(s: Recorder) -> None:
    await s.update({"type": "realtime", "audio": {"input": {
        "format": {"type": "audio/pcm", "rate": RATE}, "transcription": {"model": "whisper-1"},
        "turn_detection": {"type": "server_vad", "silence_duration_ms": 300}}}})
    silence = np.zeros(RATE // 2, np.float32)
    await s.stream(np.concatenate([silence, speech_like(0.8, RATE), silence]))
    await s.until("input_audio_buffer.speech_started")
    await s.until("input_audio_buffer.committed")
    await s.until("response.done")
    if not any(e["type"] == "conversation.item.input_audio_transcription.completed" for e in s.events):
        await s.until("conversation.item.input_audio_transcription.completed")


async def function_call_round_trip(s: Recorder, server: LiveServer) -> None:
    await s.update({"type": "realtime", "output_modalities": ["text"], "tools": [TOOL], "tool_choice": "auto",
                    "audio": {"input": {"turn_detection": None}}})
    await s.say("Weather in Paris?")
    server.engine.words = CALL_WORDS[1:]
    await s.send({"type": "response.create"})
    done = await s.until("response.done")
    call = done["response"]["output"][0]
    server.engine.words = ("It", " is", " sunny.")
    await s.send({"type": "conversation.item.create", "item": {
        "type": "function_call_output", "call_id": call["call_id"], "output": '{"sky": "sunny"}'}})
    await s.send({"type": "response.create", "response": {"output_modalities": ["audio"]}})
    await s.until("response.done")


async def cancel_and_barge_in(s: Recorder, server: LiveServer) -> None:
    await s.update({"type": "realtime", "audio": {"input": {
        "format": {"type": "audio/pcm", "rate": RATE},
        "turn_detection": {"type": "server_vad", "create_response": False}}}})
    server.engine.delay_s = 0.1
    await s.say("hi")
    for stop in ({"type": "response.cancel"}, {"type": "output_audio_buffer.clear"}):
        await s.send({"type": "response.create"})
        await s.until("response.output_audio.delta")
        await s.send(stop)
        await s.until("response.done")
    await s.send({"type": "response.create"})
    await s.until("response.created")
    await s.stream(speech_like(0.5, RATE))  # barge-in
    await s.until("response.done")
    await s.send({"type": "output_audio_buffer.clear"})  # nothing playing
    await s.until("output_audio_buffer.cleared")


async def errors(s: Recorder) -> None:
    await s.send({"type": "no.such.event"})
    await s.until("error")
    await s.send({"type": "session.update", "session": {"audio": {"output": {"voice": "Nobody"}}}})
    await s.until("session.updated")
    await s.send({"type": "input_audio_buffer.commit"})
    await s.until("error")
    await s.send({"type": "response.cancel"})
    await s.until("error")
    await s.send({"type": "conversation.item.retrieve", "item_id": "missing"})
    await s.until("error")


async def cut_at_max_output_tokens(s: Recorder) -> None:
    await s.update({"type": "realtime", "max_output_tokens": 3, "audio": {"input": {"turn_detection": None}}})
    await s.say("tell me a story")
    await s.send({"type": "response.create"})
    await s.until("response.done")


async def ga_sessions(server: LiveServer) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = []
    for scenario in (text_turn_and_items, spoken_turn_truncated, vad_turn_with_transcription, errors,
                     cut_at_max_output_tokens):
        events += await recorded(server, scenario)
    events += await recorded(server, lambda s: function_call_round_trip(s, server))
    server.engine.reset()
    events += await recorded(server, lambda s: cancel_and_barge_in(s, server))
    return events


def test_every_ga_event_reads_in_the_openai_sdk_and_openai_agents(server: LiveServer) -> None:
    events = asyncio.run(ga_sessions(server))
    kinds = {e["type"] for e in events}
    # The sessions did produce what they are here to check.
    assert {"response.content_part.added", "response.output_audio.delta", "response.output_text.delta",
            "response.function_call_arguments.done", "conversation.item.input_audio_transcription.completed",
            "input_audio_buffer.speech_started", "conversation.item.truncated", "conversation.item.retrieved",
            "conversation.item.deleted", "output_audio_buffer.cleared", "input_audio_buffer.cleared",
            "error"} <= kinds, kinds
    statuses = {e["response"]["status"] for e in events if e["type"] == "response.done"}
    assert statuses == {"completed", "cancelled", "incomplete"}
    problems = sdk_problems(events), asyncio.run(agents_problems(events))
    assert problems == ([], []), "\n".join(sorted({p[:400] for p in problems[0] + problems[1]}))


# -- beta sessions ------------------------------------------------------------------------------------------------
async def beta_session(s: Recorder, server: LiveServer) -> None:
    await s.update({"modalities": ["text", "audio"], "turn_detection": None, "voice": "alloy",
                    "input_audio_format": "pcm16", "input_audio_transcription": {"model": "whisper-1"},
                    "tools": [TOOL]})
    await s.say("hi", id="u1")
    await s.until("conversation.item.created")
    await s.send({"type": "response.create"})
    done = await s.until("response.done")
    answer = done["response"]["output"][0]["id"]
    await s.send({"type": "conversation.item.truncate", "item_id": answer, "content_index": 0, "audio_end_ms": 100})
    await s.until("conversation.item.truncated")
    await s.send({"type": "conversation.item.retrieve", "item_id": answer})
    await s.until("conversation.item.retrieved")
    await s.send({"type": "response.create", "response": {"modalities": ["text"]}})
    await s.until("response.done")
    await s.send({"type": "input_audio_buffer.append",
                  "audio": next(pcm16_pieces(speech_like(0.5, 24000), 24000, 500))})
    await s.send({"type": "input_audio_buffer.commit"})
    await s.until("conversation.item.input_audio_transcription.completed")
    server.engine.words = CALL_WORDS[1:]
    await s.send({"type": "response.create"})
    await s.until("response.done")
    await s.send({"type": "conversation.item.delete", "item_id": "u1"})
    await s.until("conversation.item.deleted")
    await s.send({"type": "no.such.event"})
    await s.until("error")


def test_every_beta_event_reads_in_the_openai_sdk_beta_union(server: LiveServer) -> None:
    events = asyncio.run(recorded(server, lambda s: beta_session(s, server), beta=True))
    kinds = {e["type"] for e in events}
    assert {"conversation.item.created", "response.audio.delta", "response.text.delta",
            "response.function_call_arguments.done", "conversation.item.input_audio_transcription.completed",
            "conversation.item.truncated", "conversation.item.retrieved", "error"} <= kinds, kinds
    problems = sdk_problems(events, beta=True)
    assert problems == [], "\n".join(sorted({p[:400] for p in problems}))
    # Beta clients see the beta content types wherever an item is carried.
    for event in events:
        for item in _items(event):
            assert not {p["type"] for p in item.get("content", [])} & {"output_audio", "output_text"}, event


def _items(event: dict[str, Any]) -> list[dict[str, Any]]:
    if "item" in event:
        return [event["item"]]
    return list(event.get("response", {}).get("output", []))


@pytest.mark.parametrize("beta", [False, True])
def test_the_validators_can_fail(beta: bool) -> None:
    """A part type the SDK does not know is caught by both readers."""
    bad = {"type": "response.content_part.added", "event_id": "e", "response_id": "r", "item_id": "i",
           "output_index": 0, "content_index": 0, "part": {"type": "output_video", "text": ""}}
    assert sdk_problems([bad], beta=beta)
    if not beta:
        assert asyncio.run(agents_problems([bad]))


def test_a_16khz_input_is_the_one_extension_outside_the_sdk_schema() -> None:
    """OpenAI's PCM is 24 kHz only (``rate: Literal[24000]``); a session that asks for 16 kHz is told the truth, and
    that is the only field the SDK refuses in it."""
    from omnistage.entrypoints.openai.realtime.protocol import InputFormat, SessionConfig

    session = SessionConfig(input_format=InputFormat("pcm16", 16000)).describe("sess_1", "fake-omni")
    event = {"type": "session.updated", "event_id": "e", "session": session}
    (problem,) = sdk_problems([event])
    assert "'audio', 'input', 'format', 'AudioPCM', 'rate'" in problem
    session["audio"]["input"]["format"]["rate"] = 24000
    assert sdk_problems([event]) == []


# -- openai-agents against the server ------------------------------------------------------------------------------
async def agent_turns(server: LiveServer) -> tuple[list[Any], list[dict[str, Any]]]:
    """A text turn, then a spoken turn (24 kHz PCM16 committed by the client), through ``RealtimeRunner``."""
    from agents.realtime import RealtimeAgent, RealtimeRunner
    from agents.realtime.model_inputs import RealtimeModelSendRawMessage

    runner = RealtimeRunner(RealtimeAgent(name="helper", instructions="Answer briefly."),
                            config={"model_settings": {"turn_detection": None}})
    seen: list[Any] = []
    raw: list[dict[str, Any]] = []

    async def until_turn_ends(session) -> None:  # noqa: ANN001
        async for event in session:
            seen.append(event)
            if event.type == "raw_model_event" and event.data.type == "raw_server_event":
                raw.append(event.data.data)
            if event.type in ("agent_end", "error"):
                return

    async with await runner.run(model_config={"url": ws_url(server), "api_key": "unused"}) as session:
        await session.send_message("Hello?")
        await until_turn_ends(session)
        pcm = b"".join(base64.b64decode(p) for p in pcm16_pieces(speech_like(0.5, RATE), RATE))
        await session.send_audio(pcm, commit=True)
        # With turn detection off the client asks for the answer, as OpenAI's push-to-talk does.
        await session.model.send_event(RealtimeModelSendRawMessage(message={"type": "response.create"}))
        await until_turn_ends(session)
    return seen, raw


def test_openai_agents_realtime_runner_text_and_audio_turns(server: LiveServer) -> None:
    seen, raw = asyncio.run(asyncio.wait_for(agent_turns(server), 30))
    errors = [e for e in seen if e.type == "error"]
    assert errors == []
    assert [e.type for e in seen].count("agent_end") == 2
    assert any(e.type == "audio" for e in seen)
    assert [e["response"]["status"] for e in raw if e["type"] == "response.done"] == ["completed", "completed"]
