"""LiveKit Agents 1.8.9 against a live server: the OpenAI plugin's ``realtime.RealtimeModel`` with its default
session (semantic_vad, voice marin), ``update_chat_ctx``, ``generate_reply``, server VAD on pushed audio; and
its ``openai.LLM`` with metadata, store, parallel_tool_calls and tools."""

from __future__ import annotations

import asyncio
import json
import shutil
from typing import Any

import aiohttp
import httpx
import numpy as np
import openai
import pytest
from livekit import rtc
from livekit.agents import llm
from livekit.plugins import openai as lk_openai

from omnistage.audio.decode import resample
from tests.audio.signals import peak_hz, speech_like
from tests.audio.test_smart_turn import spoken
from tests.entrypoints.conftest import LiveServer
from tests.entrypoints.fake_engine import SINE_HZ
from tests.entrypoints.test_chat_compat import CALL_WORDS

pytestmark = pytest.mark.e2e
TIMEOUT_S = 20.0
RATE = 24000


async def answer(generation: llm.GenerationCreatedEvent) -> tuple[str, np.ndarray]:
    """The text and audio of a generation's messages, as an agent would play them."""
    text, audio = [], []
    async for message in generation.message_stream:
        async for frame in message.audio_stream:
            audio.append(np.frombuffer(bytes(frame.data), "<i2"))
        async for piece in message.text_stream:
            text.append(str(piece))
    samples = np.concatenate(audio).astype(np.float32) / 32767 if audio else np.zeros(0, np.float32)
    return "".join(text), samples


@llm.function_tool
async def get_weather(city: str) -> str:
    """The weather in a city.

    Args:
        city: the city's name
    """
    return f"sunny in {city}"


def realtime_model(server: LiveServer, http: aiohttp.ClientSession, **options: Any) -> lk_openai.realtime.RealtimeModel:
    return lk_openai.realtime.RealtimeModel(base_url=f"{server.base_url}/v1", api_key="unused",
                                            model=server.engine.model_name, http_session=http, **options)


# LiveKit's defaults (semantic_vad, voice marin), and a checkpoint speaker with turn detection off.
SESSIONS = [({}, "semantic_vad", "Chelsie"), ({"voice": "Ethan", "turn_detection": None}, None, "Ethan")]


@pytest.mark.parametrize(("options", "detection", "speaker"), SESSIONS)
def test_realtime_model_session_chat_ctx_and_generate_reply(server: LiveServer, options: dict[str, Any],
                                                            detection: str | None, speaker: str) -> None:
    async def scenario() -> None:
        async with aiohttp.ClientSession() as http:
            model = realtime_model(server, http, **options)
            session = model.session()
            events: list[dict[str, Any]] = []
            session.on("openai_server_event_received", events.append)
            errors: list[Any] = []
            session.on("error", errors.append)
            try:
                chat_ctx = llm.ChatContext.empty()
                chat_ctx.add_message(role="system", content="Speak like a pirate.")
                chat_ctx.add_message(role="user", content="Hello there.")
                chat_ctx.add_message(role="assistant", content="Ahoy.")
                chat_ctx.add_message(role="user", content="How are you?")
                await asyncio.wait_for(session.update_chat_ctx(chat_ctx), TIMEOUT_S)
                generation = await asyncio.wait_for(session.generate_reply(instructions="Be brief."), TIMEOUT_S)
                assert generation.user_initiated
                text, audio = await asyncio.wait_for(answer(generation), TIMEOUT_S)
                assert text == "Hello from the fake engine."
                assert len(audio) > 0 and abs(peak_hz(audio, RATE) - SINE_HZ) < 5
            finally:
                await session.aclose()
                await model.aclose()
            assert errors == [] and not [e for e in events if e["type"] == "error"]
            updated = next(e for e in events if e["type"] == "session.updated")["session"]
            turn_detection = updated["audio"]["input"]["turn_detection"]
            assert (turn_detection and turn_detection["type"]) == detection
            assert updated["audio"]["output"]["voice"] == speaker  # marin → Chelsie by the default voice table
            # The remote history mirrors the chat context, the answer appended.
            assert [m.role for m in session.chat_ctx.messages()][-4:] == ["user", "assistant", "user", "assistant"]
    asyncio.run(scenario())
    request = server.engine.requests[-1]
    assert request.wants_audio and request.voice == speaker
    rendered = server.engine.front_end.processor.tokenizer.decode(request.prompt.token_ids)
    assert "Speak like a pirate." in rendered and "Be brief." in rendered and "How are you?" in rendered


@pytest.mark.skipif(shutil.which("espeak-ng") is None, reason="semantic_vad's classifier needs real speech")
def test_realtime_model_server_vad_turn_reaches_the_agent_as_audio(server: LiveServer) -> None:
    # semantic_vad (LiveKit's default, eagerness auto): its classifier ends a finished question at its first pause
    # (a vowel without words may sound unfinished to it, and wait 4 s). 1.5 s of silence follow.
    question = resample(spoken("How are you today?", tail_s=0.0), 16000, RATE).astype(np.float32)
    speech = np.concatenate([np.zeros(RATE // 2, np.float32), question, np.zeros(3 * RATE // 2, np.float32)])
    pcm = (speech * 32767).astype("<i2")

    async def scenario() -> None:
        async with aiohttp.ClientSession() as http:
            model = realtime_model(server, http)
            session = model.session()
            generations: asyncio.Queue[llm.GenerationCreatedEvent] = asyncio.Queue()
            session.on("generation_created", generations.put_nowait)
            speech_events: list[str] = []
            session.on("input_speech_started", lambda _: speech_events.append("started"))
            session.on("input_speech_stopped", lambda _: speech_events.append("stopped"))
            transcribed: asyncio.Queue[llm.InputTranscriptionCompleted] = asyncio.Queue()
            session.on("input_audio_transcription_completed",
                       lambda e: transcribed.put_nowait(e) if e.is_final else None)
            try:
                step = RATE // 50  # 20 ms frames, as a room's track delivers them
                for i in range(0, len(pcm), step):
                    chunk = pcm[i:i + step]
                    session.push_audio(rtc.AudioFrame(chunk.tobytes(), RATE, 1, len(chunk)))
                    await asyncio.sleep(0)
                generation = await asyncio.wait_for(generations.get(), TIMEOUT_S)
                assert not generation.user_initiated  # started by the server's turn detection
                text, audio = await asyncio.wait_for(answer(generation), TIMEOUT_S)
                # LiveKit asks for input transcription by default: the thinker writes the turn down.
                transcript = await asyncio.wait_for(transcribed.get(), TIMEOUT_S)
            finally:
                await session.aclose()
                await model.aclose()
            assert speech_events == ["started", "stopped"]
            assert transcript.transcript == "Hello from the fake engine."
            assert text == "Hello from the fake engine." and abs(peak_hz(audio, RATE) - SINE_HZ) < 5
    asyncio.run(scenario())
    # The transcript's requests (the commit's, and any run while the turn was spoken: text only), one answer.
    wants = [r.wants_audio for r in server.engine.requests]
    assert wants.count(True) == 1 and wants.count(False) >= 1


def test_realtime_model_function_call_round_trip(server: LiveServer) -> None:
    """Session tools from update_tools; the call arrives on the generation's function stream; its output goes
    back through update_chat_ctx, as an AgentSession does, and the next reply answers from it."""
    server.engine.words = CALL_WORDS

    async def scenario() -> tuple[list[llm.FunctionCall], str]:
        async with aiohttp.ClientSession() as http:
            model = realtime_model(server, http)
            session = model.session()
            try:
                await session.update_tools([get_weather])
                chat_ctx = llm.ChatContext.empty()
                chat_ctx.add_message(role="user", content="Weather in Paris?")
                await asyncio.wait_for(session.update_chat_ctx(chat_ctx), TIMEOUT_S)
                generation = await asyncio.wait_for(session.generate_reply(), TIMEOUT_S)
                text, _ = await asyncio.wait_for(answer(generation), TIMEOUT_S)
                assert text == "Let me check."
                calls = [call async for call in generation.function_stream]
                server.engine.words = ("It", " is", " sunny.")
                chat_ctx = session.chat_ctx.copy()
                chat_ctx.insert(llm.FunctionCallOutput(call_id=calls[0].call_id, name=calls[0].name,
                                                       output="sunny in Paris", is_error=False))
                await asyncio.wait_for(session.update_chat_ctx(chat_ctx), TIMEOUT_S)
                generation = await asyncio.wait_for(session.generate_reply(), TIMEOUT_S)
                reply, _ = await asyncio.wait_for(answer(generation), TIMEOUT_S)
            finally:
                await session.aclose()
                await model.aclose()
            return calls, reply
    calls, reply = asyncio.run(scenario())
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [("get_weather", {"city": "Paris"})]
    assert reply == "It is sunny."
    rendered = server.engine.front_end.processor.tokenizer.decode(server.engine.requests[-1].prompt.token_ids)
    assert "<tool_response>\nsunny in Paris\n</tool_response>" in rendered and '"get_weather"' in rendered


def test_llm_with_metadata_store_parallel_tool_calls_and_tools(server: LiveServer) -> None:
    server.engine.words = CALL_WORDS
    sent: list[dict[str, Any]] = []

    async def record(request: httpx.Request) -> None:
        sent.append(json.loads(request.content))

    async def scenario() -> list[llm.ChatChunk]:
        client = openai.AsyncOpenAI(base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0,
                                    http_client=httpx.AsyncClient(event_hooks={"request": [record]}))
        model = lk_openai.LLM(model=server.engine.model_name, client=client, metadata={"session": "abc"}, store=False,
                              parallel_tool_calls=False, temperature=0.0)
        chat_ctx = llm.ChatContext.empty()
        chat_ctx.add_message(role="user", content="Weather in Paris?")
        chunks = []
        # LiveKit 1.8.9 takes store= but does not send it; extra_kwargs does.
        async with model.chat(chat_ctx=chat_ctx, tools=[get_weather], extra_kwargs={"store": False}) as stream:
            async for chunk in stream:
                chunks.append(chunk)
        await model.aclose()
        await client.close()
        return chunks
    chunks = asyncio.run(scenario())
    (body,) = sent
    assert (body["metadata"], body["store"], body["parallel_tool_calls"]) == ({"session": "abc"}, False, False)
    assert [t["function"]["name"] for t in body["tools"]] == ["get_weather"]
    calls = [c for chunk in chunks if chunk.delta for c in chunk.delta.tool_calls or ()]
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [("get_weather", {"city": "Paris"})]
    assert "".join(chunk.delta.content or "" for chunk in chunks if chunk.delta) == "Let me check."
    rendered = server.engine.front_end.processor.tokenizer.decode(server.engine.requests[-1].prompt.token_ids)
    assert '"get_weather"' in rendered and "the city's name" in rendered  # the tool reached the chat template
