"""Chat completions as OpenAI's and vLLM's clients send them, driven with the ``openai`` SDK: harmless unknown
fields, tool calls (whole and streamed), logprobs, n choices, voices, vLLM-Omni's request shapes."""

from __future__ import annotations

import json
from collections.abc import Iterator

import openai
import pytest

from omnistage.entrypoints.openai.api_server import build_app
from omnistage.entrypoints.openai.server_config import ServingOptions
from omnistage.sampling_params import SamplingParams
from tests.entrypoints.conftest import TEST_LIMITS, LiveServer
from tests.entrypoints.fake_engine import FakeEngine, RecordingProcessor, fake_front_end
from tests.entrypoints.server_thread import ServerThread

USER = [{"role": "user", "content": "What is the weather in Paris?"}]
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "the weather in a city",
                                           "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                          "required": ["city"]}}}]
CALL_WORDS = ("Let me check.", "\n<tool_call>", '\n{"name": "get_weather", ', '"arguments": {"city": "Paris"}}',
              "\n</tool_call>")


def test_harmless_fields_are_accepted(server: LiveServer) -> None:
    reply = server.client().chat.completions.create(
        model="fake-omni", messages=USER, logprobs=False, tools=[], presence_penalty=0, frequency_penalty=0,
        metadata={"team": "a"}, store=False, parallel_tool_calls=None, service_tier="auto", user="u",
        response_format={"type": "text"}, extra_body={"frobnicate": {"a": 1}, "skip_special_tokens": True})
    assert reply.choices[0].message.content == "Hello from the fake engine."
    sampling = server.engine.requests[-1].sampling
    assert (sampling.presence_penalty, sampling.frequency_penalty, sampling.logprobs) == (0.0, 0.0, None)


def test_tool_call_round_trip(server: LiveServer) -> None:
    client = server.client()
    server.engine.words = CALL_WORDS
    reply = client.chat.completions.create(model="fake-omni", messages=USER, tools=TOOLS)
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content == "Let me check."
    (call,) = choice.message.tool_calls
    assert call.function.name == "get_weather" and json.loads(call.function.arguments) == {"city": "Paris"}
    rendered = server.engine.front_end.processor.tokenizer.decode(server.engine.requests[-1].prompt.token_ids)
    assert "<tools>" in rendered and '"get_weather"' in rendered  # the template showed the tools
    server.engine.words = ("It", " is", " sunny.")
    history = [*USER, choice.message.model_dump(exclude_none=True),
               {"role": "tool", "tool_call_id": call.id, "content": '{"sky": "sunny"}'}]
    answer = client.chat.completions.create(model="fake-omni", messages=history, tools=TOOLS)
    assert answer.choices[0].message.content == "It is sunny." and answer.choices[0].finish_reason == "stop"
    rendered = server.engine.front_end.processor.tokenizer.decode(server.engine.requests[-1].prompt.token_ids)
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>' in rendered
    assert '<tool_response>\n{"sky": "sunny"}\n</tool_response>' in rendered


def test_streamed_tool_call_and_unspoken_span(server: LiveServer) -> None:
    server.engine.words = CALL_WORDS
    chunks = list(server.client().chat.completions.create(
        model="fake-omni", messages=USER, tools=TOOLS, stream=True, modalities=["text", "audio"],
        audio={"voice": "alloy", "format": "pcm16"}))
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    transcript = "".join(getattr(c.choices[0].delta.audio, "transcript", None) or "" for c in chunks if c.choices)
    calls = [tc for c in chunks if c.choices for tc in c.choices[0].delta.tool_calls or []]
    assert content == transcript == "Let me check."  # the call is neither shown as text nor spoken
    assert [c.function.name for c in calls] == ["get_weather"] and calls[0].id.startswith("call_")
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    request = server.engine.requests[-1]
    tokenizer = server.engine.front_end.processor.tokenizer
    assert request.unspoken is not None and request.voice == "Chelsie"  # OpenAI's alloy, mapped
    assert tokenizer.convert_ids_to_tokens(request.unspoken.open_id) == "<tool_call>"
    assert {c.model_extra.get("modality") for c in chunks if c.choices and
            getattr(c.choices[0].delta.audio, "data", None)} == {"audio"}


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "get_weather"}}])
def test_forced_tool_choice_opens_the_answer_with_a_call(server: LiveServer, choice: object) -> None:
    forced = isinstance(choice, dict)
    server.engine.words = ('{"city": "Rome"}}', "\n</tool_call>") if forced else CALL_WORDS[2:]
    reply = server.client().chat.completions.create(model="fake-omni", messages=USER, tools=TOOLS,
                                                    tool_choice=choice)
    (call,) = reply.choices[0].message.tool_calls
    assert call.function.name == "get_weather"
    tail = server.engine.front_end.processor.tokenizer.decode(server.engine.requests[-1].prompt.token_ids[-40:])
    assert tail.endswith('<tool_call>\n{"name": "get_weather", "arguments": ' if forced else "<tool_call>\n")


def test_tool_choice_none_hides_tools_and_parallel_false_keeps_one(server: LiveServer) -> None:
    server.engine.words = CALL_WORDS + CALL_WORDS[1:]
    reply = server.client().chat.completions.create(model="fake-omni", messages=USER, tools=TOOLS,
                                                    parallel_tool_calls=False)
    assert len(reply.choices[0].message.tool_calls) == 1
    reply = server.client().chat.completions.create(model="fake-omni", messages=USER, tools=TOOLS,
                                                    tool_choice="none")
    assert reply.choices[0].message.tool_calls is None and "<tool_call>" in reply.choices[0].message.content
    assert "<tools>" not in server.engine.front_end.processor.tokenizer.decode(server.engine.requests[-1].prompt.token_ids)


def test_logprobs_whole_and_streamed(server: LiveServer) -> None:
    client = server.client()
    reply = client.chat.completions.create(model="fake-omni", messages=USER, logprobs=True, top_logprobs=2)
    content = reply.choices[0].logprobs.content
    assert [round(c.logprob, 3) for c in content] == [-0.1, -0.2, -0.3, -0.4, -0.5, -0.6]
    assert all(len(c.top_logprobs) == 2 and c.bytes == list(c.token.encode()) for c in content)
    assert server.engine.requests[-1].sampling.logprobs == 2
    chunks = list(client.chat.completions.create(model="fake-omni", messages=USER, logprobs=True, stream=True))
    streamed = [lp for c in chunks if c.choices and c.choices[0].logprobs for lp in c.choices[0].logprobs.content]
    assert len(streamed) == 6 and all(not lp.top_logprobs for lp in streamed)


def test_n_choices_whole_and_streamed(server: LiveServer) -> None:
    client = server.client()
    reply = client.chat.completions.create(model="fake-omni", messages=USER, n=3, seed=7,
                                           stream_options=None)
    assert [c.index for c in reply.choices] == [0, 1, 2]
    assert all(c.message.content == "Hello from the fake engine." for c in reply.choices)
    assert [r.sampling.seed for r in server.engine.requests] == [7, 8, 9]
    assert reply.usage.completion_tokens == 18 and reply.usage.prompt_tokens == len(server.engine.requests[0].prompt
                                                                                   .token_ids)
    server.engine.reset()
    chunks = list(client.chat.completions.create(model="fake-omni", messages=USER, n=2, stream=True,
                                                 stream_options={"include_usage": True,
                                                                 "include_obfuscation": False}))
    texts = {i: "".join(c.choices[0].delta.content or "" for c in chunks if c.choices and c.choices[0].index == i)
             for i in (0, 1)}
    assert texts == {0: "Hello from the fake engine.", 1: "Hello from the fake engine."}
    assert chunks[-1].usage.completion_tokens == 12
    assert sorted(c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason) == \
        ["stop", "stop"]


def test_vllm_omni_shapes(server: LiveServer) -> None:
    client = server.client()
    reply = client.chat.completions.create(
        model="fake-omni", messages=USER, modalities=["audio"],
        extra_body={"speaker": "aiden", "ignore_eos": True, "chat_template_kwargs": {"enable_thinking": False},
                    "mm_processor_kwargs": {"use_audio_in_video": False},
                    "sampling_params_list": [{"temperature": 0.3, "top_k": 20, "seed": 5}, {"temperature": 0.9}]})
    request = server.engine.requests[-1]
    assert request.voice == "Aiden" and request.wants_audio
    assert (request.sampling.temperature, request.sampling.top_k, request.sampling.seed) == (0.3, 20, 5)
    assert request.sampling.ignore_eos
    assert reply.choices[0].message.content is None  # audio only: the text is the transcript
    assert reply.choices[0].message.audio.transcript == "Hello from the fake engine."
    client.chat.completions.create(model="fake-omni", messages=USER, modalities=["text", "audio"])
    assert server.engine.requests[-1].voice == "Chelsie"  # no audio object: the default voice, WAV


def test_sampling_defaults_fill_what_the_request_leaves(server: LiveServer) -> None:
    server.engine.default_sampling = SamplingParams(temperature=0.0, top_p=0.8, top_k=20, max_tokens=3)
    try:
        server.client().chat.completions.create(model="fake-omni", messages=USER, top_p=0.5)
    finally:
        server.engine.default_sampling = SamplingParams()
    sampling = server.engine.requests[-1].sampling
    assert (sampling.temperature, sampling.top_p, sampling.top_k, sampling.max_tokens) == (0.0, 0.5, 20, 3)


@pytest.fixture(scope="module")
def named_server(processor: RecordingProcessor) -> Iterator[LiveServer]:
    engine = FakeEngine(fake_front_end(processor))
    options = ServingOptions(served_model_names=("Qwen/Qwen3-Omni-30B-A3B-Instruct", "omni"),
                             voice_aliases=(("robot", "Aiden"), ("alloy", "Ethan")),
                             default_modalities=("text", "audio"))
    thread = ServerThread(build_app(engine, TEST_LIMITS, serving=options))
    yield LiveServer(thread.start(), engine, processor.folder)
    thread.stop()


def test_served_names_aliases_and_default_modalities(named_server: LiveServer) -> None:
    client = named_server.client()
    assert [m.id for m in client.models.list()] == ["Qwen/Qwen3-Omni-30B-A3B-Instruct", "omni"]
    assert client.models.retrieve("Qwen/Qwen3-Omni-30B-A3B-Instruct").id == "Qwen/Qwen3-Omni-30B-A3B-Instruct"
    for name, voice, speaker in (("omni", "robot", "Aiden"), ("Qwen/Qwen3-Omni-30B-A3B-Instruct", "alloy", "Ethan")):
        reply = client.chat.completions.create(model=name, messages=USER, extra_body={"speaker": voice})
        assert reply.choices[0].message.audio is not None  # vLLM-Omni's default: text and audio
        assert named_server.engine.requests[-1].voice == speaker
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="fake-omni", messages=USER)
