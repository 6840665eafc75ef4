"""``/v1/responses`` driven by real clients against a live server on a scripted fake thinker: the openai SDK
(whole, streamed, chained with ``previous_response_id``, a function tool round trip, audio and image input,
retrieve/delete), openai-agents' default model path (``OpenAIResponsesModel``) running a function tool, and
LiteLLM. Every response and stream event read raw is validated against the SDK's own types."""

from __future__ import annotations

import asyncio
import base64
import io
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass, replace

import httpx
import numpy as np
import openai
import pytest
import soundfile as sf
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter

from omnistage.core import OmniRequest
from omnistage.entrypoints.openai.api_server import build_app
from omnistage.entrypoints.openai.server_config import MediaPolicy
from tests.entrypoints.conftest import TEST_LIMITS
from tests.entrypoints.fake_engine import FakeEngine, RecordingProcessor, fake_front_end
from tests.entrypoints.media_samples import b64, data_url, png_bytes
from tests.entrypoints.server_thread import ServerThread

MODEL = "fake-omni"
TOOL = {"type": "function", "name": "get_weather", "description": "the weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
CALL_WORDS = ("Let me check.", "\n<tool_call>", '\n{"name": "get_weather", ', '"arguments": {"city": "Paris"}}',
              "\n</tool_call>")
ANSWER_WORDS = ("It", " is", " sunny", " in", " Paris.")
EVENTS = TypeAdapter(ResponseStreamEvent)


class ScriptedEngine(FakeEngine):
    """With ``tool_script`` on, answers with a get_weather call until the prompt carries a tool's response,
    then with ``ANSWER_WORDS`` (an agent's two turns)."""

    tool_script: bool = False

    async def generate(self, request: OmniRequest):  # noqa: ANN201 - FakeEngine's async generator
        if self.tool_script:
            rendered = self.front_end.processor.tokenizer.decode(request.prompt.token_ids)
            self.words = ANSWER_WORDS if "<tool_response>" in rendered else CALL_WORDS
        async for out in super().generate(request):
            yield out


@dataclass
class Served:
    url: str
    engine: ScriptedEngine

    def client(self) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.url}/v1", api_key="unused", max_retries=0, timeout=20)

    def prompt(self, index: int = -1) -> str:
        return self.engine.front_end.processor.tokenizer.decode(self.engine.requests[index].prompt.token_ids)

    def post(self, body: dict[str, object]) -> httpx.Response:
        return httpx.post(f"{self.url}/v1/responses", json={"model": MODEL, **body}, timeout=20)

    def events(self, body: dict[str, object]) -> list[ResponseStreamEvent]:
        """The raw SSE stream, each event validated against the SDK's union (the client itself never validates)."""
        events = []
        with httpx.stream("POST", f"{self.url}/v1/responses", json={"model": MODEL, "stream": True, **body},
                          timeout=20) as reply:
            assert reply.status_code == 200, reply.read()
            for line in reply.iter_lines():
                if line.startswith("data: "):
                    events.append(EVENTS.validate_json(line[len("data: "):]))
        assert [e.sequence_number for e in events] == list(range(len(events)))
        return events


@pytest.fixture(scope="module")
def live(processor: RecordingProcessor) -> Iterator[Served]:
    engine = ScriptedEngine(fake_front_end(processor))
    limits = replace(TEST_LIMITS, max_stored_responses=4, max_messages=8)
    thread = ServerThread(build_app(engine, limits, MediaPolicy()))
    yield Served(thread.start(), engine)
    thread.stop()


@pytest.fixture()
def served(live: Served, processor: RecordingProcessor) -> Served:
    live.engine.reset()
    live.engine.tool_script = False
    processor.seen_audios.clear()
    processor.seen_images.clear()
    return live


def _validated(reply: httpx.Response) -> Response:
    assert reply.status_code == 200, reply.text
    return Response.model_validate(reply.json())


def test_plain_text_with_instructions(served: Served) -> None:
    response = served.client().responses.create(model=MODEL, input="Hi there", instructions="Answer briefly.",
                                                max_output_tokens=50, temperature=0.5, top_p=0.9)
    assert response.output_text == "Hello from the fake engine." and response.status == "completed"
    assert response.usage.output_tokens == 6 and response.usage.input_tokens == len(served.engine.requests[-1]
                                                                                        .prompt.token_ids)
    sampling = served.engine.requests[-1].sampling
    assert (sampling.max_tokens, sampling.temperature, sampling.top_p) == (50, 0.5, 0.9)
    assert "<|im_start|>system\nAnswer briefly.<|im_end|>" in served.prompt()
    assert "<|im_start|>user\nHi there<|im_end|>" in served.prompt()
    raw = _validated(served.post({"input": [{"role": "user", "content": [{"type": "input_text", "text": "x"}]}]}))
    assert raw.output[0].type == "message" and raw.output[0].content[0].text == "Hello from the fake engine."


def test_streamed_events_in_order_and_valid(served: Served) -> None:
    events = served.events({"input": "Hi"})
    types = [e.type for e in events]
    assert types[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]
    assert types[-4:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                          "response.completed"]
    deltas = [e.delta for e in events if e.type == "response.output_text.delta"]
    assert "".join(deltas) == "Hello from the fake engine." and len(deltas) == 6
    assert events[-1].response.usage.total_tokens > 6
    sdk = list(served.client().responses.create(model=MODEL, input="Hi", stream=True))
    assert [e.type for e in sdk] == types and sdk[-1].response.output_text == "Hello from the fake engine."


def test_previous_response_id_chains_and_store_false_keeps_none(served: Served) -> None:
    client = served.client()
    first = client.responses.create(model=MODEL, input="My name is Ada.", instructions="Be kind.")
    served.engine.words = ("Ada.",)
    second = client.responses.create(model=MODEL, input="What is my name?", previous_response_id=first.id)
    prompt = served.prompt()
    assert "My name is Ada." in prompt and "Hello from the fake engine." in prompt and "What is my name?" in prompt
    assert "Be kind." not in prompt  # instructions are not carried over
    assert second.previous_response_id == first.id and second.output_text == "Ada."
    third = client.responses.create(model=MODEL, input="And again?", previous_response_id=second.id, store=False)
    assert "My name is Ada." in served.prompt() and "What is my name?" in served.prompt()
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(third.id)


def test_retrieve_and_delete(served: Served) -> None:
    client = served.client()
    made = client.responses.create(model=MODEL, input="Hi")
    got = _validated(httpx.get(f"{served.url}/v1/responses/{made.id}"))
    assert got.id == made.id and got.output_text == made.output_text
    client.responses.delete(made.id)
    reply = httpx.get(f"{served.url}/v1/responses/{made.id}")
    assert reply.status_code == 404 and reply.json()["error"]["type"] == "invalid_request_error"
    assert httpx.delete(f"{served.url}/v1/responses/{made.id}").status_code == 404


def test_store_is_bounded(served: Served) -> None:
    client = served.client()
    ids = [client.responses.create(model=MODEL, input=f"turn {i}").id for i in range(5)]  # the store holds 4
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(ids[0])
    assert client.responses.retrieve(ids[-1]).id == ids[-1]


def test_function_tool_round_trip(served: Served) -> None:
    client = served.client()
    served.engine.words = CALL_WORDS
    first = client.responses.create(model=MODEL, input="Weather in Paris?", tools=[TOOL])
    assert "<tools>" in served.prompt() and '"get_weather"' in served.prompt()
    message, call = first.output
    assert message.content[0].text == "Let me check." and call.type == "function_call"
    assert call.name == "get_weather" and json.loads(call.arguments) == {"city": "Paris"}
    served.engine.words = ANSWER_WORDS
    final = client.responses.create(model=MODEL, previous_response_id=first.id, tools=[TOOL], input=[
        {"type": "function_call_output", "call_id": call.call_id, "output": '{"sky": "sunny"}'}])
    assert final.output_text == "It is sunny in Paris."
    prompt = served.prompt()
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>' in prompt
    assert '<tool_response>\n{"sky": "sunny"}\n</tool_response>' in prompt


def test_streamed_function_call_events(served: Served) -> None:
    served.engine.words = CALL_WORDS
    events = served.events({"input": "Weather?", "tools": [TOOL], "tool_choice": "auto"})
    types = [e.type for e in events]
    call_at = types.index("response.function_call_arguments.delta")
    assert types[call_at - 1] == "response.output_item.added" and events[call_at - 1].item.type == "function_call"
    assert types[call_at + 1: call_at + 3] == ["response.function_call_arguments.done", "response.output_item.done"]
    assert json.loads(events[call_at + 1].arguments) == {"city": "Paris"}
    assert types.index("response.output_item.done") < call_at  # the text message closed before the call
    final = events[-1].response
    assert [item.type for item in final.output] == ["message", "function_call"]


def test_input_audio_and_image(served: Served, processor: RecordingProcessor) -> None:
    buf = io.BytesIO()
    sf.write(buf, np.zeros(16000, dtype=np.float32), 16000, format="WAV")
    content = [{"type": "input_text", "text": "What do you hear and see?"},
               {"type": "input_audio", "input_audio": {"data": b64(buf.getvalue()), "format": "wav"}},
               {"type": "input_image", "image_url": data_url("image/png", png_bytes()), "detail": "auto"}]
    response = served.client().responses.create(model=MODEL, input=[{"role": "user", "content": content}])
    assert response.status == "completed"
    assert len(processor.seen_audios) == 1 and len(processor.seen_audios[0]) == 16000
    assert len(processor.seen_images) == 1
    assert "<|audio_pad|>" in served.prompt() and "<|image_pad|>" in served.prompt()


def test_max_output_tokens_is_incomplete(served: Served) -> None:
    events = served.events({"input": "Hi", "max_output_tokens": 2})
    assert events[-1].type == "response.incomplete"
    response = events[-1].response
    assert response.incomplete_details.reason == "max_output_tokens" and response.output_text == "Hello from"


def test_spoken_answer_streams_audio_events(served: Served) -> None:
    events = served.events({"input": "Hi", "modalities": ["text", "audio"], "audio": {"voice": "alloy"}})
    audio = [e for e in events if e.type == "response.audio.delta"]
    assert len(audio) == 6 and all(len(np.frombuffer(base64.b64decode(e.delta), "<i2")) == 2400
                                   for e in audio)
    transcript = "".join(e.delta for e in events if e.type == "response.audio.transcript.delta")
    assert transcript == "Hello from the fake engine." and served.engine.requests[-1].voice == "Chelsie"
    assert served.post({"input": "Hi", "modalities": ["audio"]}).status_code == 400  # not streamed: nowhere to go


@pytest.mark.parametrize(("body", "status", "param"), [
    ({"input": "Hi", "previous_response_id": "resp_unknown"}, 404, "previous_response_id"),
    ({"input": "Hi", "temperature": 5}, 400, "temperature"),
    ({"input": "Hi", "background": True}, 400, None),
    ({"input": "Hi", "tools": [{"type": "web_search"}]}, 400, None),
    ({"input": "Hi", "tool_choice": {"type": "function", "name": "nope"}, "tools": [TOOL]}, 400, "tool_choice"),
    ({"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}]}, 400, None),
    ({"input": [{"type": "reasoning", "summary": []}]}, 400, None),
    ({"input": [{"role": "user", "content": "x"}] * 9}, 400, "input"),  # --max-messages, before validation
    ({"model": "other", "input": "Hi"}, 404, "model"),
])
def test_errors_are_openai_shaped(served: Served, body: dict[str, object], status: int, param: str | None) -> None:
    reply = served.post(body)
    assert reply.status_code == status, reply.text
    error = reply.json()["error"]
    assert error["type"] == "invalid_request_error" and error["message"]
    if param is not None:
        assert error["param"] == param
    assert not served.engine.requests  # refused before any engine work


def test_sdk_raises_not_found_for_unknown_previous_response(served: Served) -> None:
    with pytest.raises(openai.NotFoundError) as caught:
        served.client().responses.create(model=MODEL, input="Hi", previous_response_id="resp_gone")
    assert "resp_gone" in caught.value.message


def test_openai_agents_runs_a_function_tool(served: Served) -> None:
    from agents import Agent, Runner, function_tool, set_default_openai_client, set_tracing_disabled

    served.engine.tool_script = True
    seen: list[str] = []

    @function_tool
    def get_weather(city: str) -> str:
        """The weather in a city."""
        seen.append(city)
        return '{"sky": "sunny"}'

    set_tracing_disabled(True)
    set_default_openai_client(openai.AsyncOpenAI(base_url=f"{served.url}/v1", api_key="unused", max_retries=0))
    agent = Agent(name="weather", instructions="Answer with the weather.", model=MODEL, tools=[get_weather])
    result = asyncio.run(Runner.run(agent, "What is the weather in Paris?"))
    assert seen == ["Paris"] and result.final_output == "It is sunny in Paris."
    assert len(served.engine.requests) == 2
    assert '<tool_response>\n{"sky": "sunny"}\n</tool_response>' in served.prompt()


def test_litellm_responses(served: Served) -> None:
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no fetch of the price list
    import litellm

    result = litellm.responses(model=f"openai/{MODEL}", input="Hi", api_base=f"{served.url}/v1", api_key="unused")
    text = "".join(part.text for item in result.output if item.type == "message" for part in item.content)
    assert text == "Hello from the fake engine." and result.usage.output_tokens == 6


def test_engine_failure_fails_the_response(served: Served) -> None:
    served.engine.fail_with = "boom"
    events = served.events({"input": "Hi"})
    assert events[-1].type == "response.failed" and "boom" in events[-1].response.error.message
    reply = served.post({"input": "Hi"})
    assert reply.status_code == 500 and reply.json()["error"]["type"] == "server_error"


def test_store_forgets_after_its_ttl() -> None:
    from omnistage.entrypoints.openai.responses.protocol import ResponseObject
    from omnistage.entrypoints.openai.responses.store import ResponseStore, StoredResponse
    from omnistage.entrypoints.openai.common.errors import APIError

    now = [0.0]
    store = ResponseStore(max_entries=10, ttl_s=60.0, clock=lambda: now[0])
    for name in ("a", "b"):
        store.put(StoredResponse(ResponseObject(id=name, created_at=0, status="completed", model=MODEL), ()))
    now[0] = 50.0
    store.get("a")  # used: its minute starts again
    now[0] = 100.0
    assert store.get("a").response.id == "a"
    with pytest.raises(APIError) as caught:
        store.get("b")
    assert caught.value.status_code == 404 and len(store) == 1
