"""What ``/v1/responses`` keeps, it counts (issue 51, row 2): metadata within OpenAI's bounds (checked on the raw
body, before it is validated), unknown item fields dropped as read, ids, names and tool definitions counted as text,
the store bounded in bytes; and a stored response belongs to the API key that made it."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, replace

import httpx
import pytest

from omnistage.entrypoints.openai.api_server import build_app
from omnistage.entrypoints.openai.server_config import AccessPolicy, MediaPolicy
from tests.entrypoints.conftest import TEST_LIMITS
from tests.entrypoints.fake_engine import FakeEngine, RecordingProcessor, fake_front_end
from tests.entrypoints.server_thread import ServerThread

MODEL = "fake-omni"
KEYS = ("key-a", "key-b")
STORE_BYTES = 20_000


@dataclass
class Served:
    url: str
    engine: FakeEngine

    def post(self, body: dict[str, object], key: str = KEYS[0]) -> httpx.Response:
        return httpx.post(f"{self.url}/v1/responses", json={"model": MODEL, **body}, timeout=30,
                          headers={"Authorization": f"Bearer {key}"})

    def call(self, method: str, response_id: str, key: str) -> httpx.Response:
        return httpx.request(method, f"{self.url}/v1/responses/{response_id}", timeout=30,
                             headers={"Authorization": f"Bearer {key}"})


@pytest.fixture(scope="module")
def served(processor: RecordingProcessor) -> Iterator[Served]:
    engine = FakeEngine(fake_front_end(processor))
    limits = replace(TEST_LIMITS, max_text_chars=5000, max_request_bytes=8_000_000,
                     max_stored_response_bytes=STORE_BYTES)
    thread = ServerThread(build_app(engine, limits, MediaPolicy(), AccessPolicy(api_keys=KEYS)))
    yield Served(thread.start(), engine)
    thread.stop()


def _error(reply: httpx.Response, status: int = 400) -> dict:
    assert reply.status_code == status, reply.text
    return reply.json()["error"]


# ---- metadata ----------------------------------------------------------------------------------------------


def test_metadata_within_openais_bounds_is_kept(served: Served) -> None:
    metadata = {f"k{i:02d}" + "x" * 61: "v" * 512 for i in range(16)}
    reply = served.post({"input": "hi", "metadata": metadata})
    assert reply.status_code == 200, reply.text
    assert served.call("GET", reply.json()["id"], KEYS[0]).json()["metadata"] == metadata


@pytest.mark.parametrize("metadata, words", [
    ({f"k{i}": "v" for i in range(17)}, "17 pairs"),
    ({"k" * 65: "v"}, "key is 65 characters"),
    ({"k": "v" * 513}, "value is 513 characters"),
])
def test_metadata_past_openais_bounds_is_a_400(served: Served, metadata: dict, words: str) -> None:
    error = _error(served.post({"input": "hi", "metadata": metadata}))
    assert error["param"] == "metadata" and words in error["message"]
    assert not served.engine.requests or all(r.prompt for r in served.engine.requests)


@pytest.mark.parametrize("metadata", [{"k": "v" * 4_000_000}, {f"k{i}": "" for i in range(500_000)}])
def test_huge_metadata_is_refused_from_its_size_unread(served: Served, metadata: dict) -> None:
    """64 MB of metadata stayed in memory with each stored response, and 1M keys blocked the event loop for
    seconds: now a 400 from the raw body's size, before the JSON is validated (or the metadata even decoded)."""
    error = _error(served.post({"input": "hi", "metadata": metadata}))
    assert error["param"] == "metadata" and "bytes of JSON" in error["message"]


# ---- what a stored response keeps ---------------------------------------------------------------------------


def test_unknown_item_fields_are_dropped_as_read() -> None:
    from omnistage.entrypoints.openai.responses.protocol import ResponsesRequest

    body = ResponsesRequest.model_validate({"model": MODEL, "input": [
        {"type": "message", "role": "user", "status": "completed", "junk": "x" * 1000,
         "content": [{"type": "input_text", "text": "hi"}]},
        {"type": "message", "role": "assistant", "content": [
            {"type": "output_text", "text": "hello", "annotations": [], "junk": "y" * 1000}]},
        {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}", "junk": 1},
        {"type": "function_call_output", "call_id": "c", "output": "ok", "junk": 2}]})
    for item in body.input:
        assert not item.model_extra and "junk" not in item.model_dump()
    assert "junk" not in body.input[1].content[0].model_dump()


def test_unknown_item_fields_are_still_accepted(served: Served) -> None:
    reply = served.post({"input": [{"type": "message", "role": "user", "content": "hi", "status": "completed",
                                    "x_unknown": "z" * 1000}]})
    assert reply.status_code == 200, reply.text


@pytest.mark.parametrize("body", [
    {"input": [{"type": "message", "role": "user", "content": "hi", "id": "m" * 6000}]},
    {"input": [{"type": "function_call", "call_id": "c" * 6000, "name": "f", "arguments": "{}"},
               {"type": "function_call_output", "call_id": "c", "output": "ok"}]},
    {"input": [{"type": "message", "role": "assistant", "content": [{"type": "refusal", "refusal": "r" * 6000}]}]},
    {"input": "hi", "tools": [{"type": "function", "name": "f", "description": "d" * 6000}]},
])
def test_what_is_stored_is_counted_as_text(served: Served, body: dict) -> None:
    error = _error(served.post(body))
    assert "--max-text-chars" in error["message"]


def test_the_store_is_bounded_in_bytes(served: Served) -> None:
    """Each stored response is charged its body: a large one pushes the least recently used out."""
    first = served.post({"input": "hi"}).json()["id"]
    assert served.call("GET", first, KEYS[0]).status_code == 200
    for _ in range(STORE_BYTES // 1500):  # each is charged more than its 1500 characters
        assert served.post({"input": "y" * 1500}).status_code == 200
    assert served.call("GET", first, KEYS[0]).status_code == 404


def test_the_store_drops_the_least_recently_used_past_its_bytes() -> None:
    from omnistage.entrypoints.openai.responses.protocol import ResponseObject
    from omnistage.entrypoints.openai.responses.store import ResponseStore, StoredResponse

    store = ResponseStore(max_entries=100, ttl_s=60.0, max_bytes=3000)
    for name in "abcd":
        store.put(StoredResponse(ResponseObject(id=name, created_at=0, status="completed", model=MODEL), (),
                                 request_bytes=1000))
    assert len(store) == 3 and store.bytes == 3000
    store.put(StoredResponse(ResponseObject(id="huge", created_at=0, status="completed", model=MODEL), (),
                             request_bytes=10_000))
    assert len(store) == 1 and store.bytes == 10_000  # one entry past the bound is kept alone


# ---- one key's responses are not another's ------------------------------------------------------------------


def test_a_response_stored_under_one_key_is_a_404_for_another(served: Served) -> None:
    made = served.post({"input": "My secret is 42."}, key=KEYS[0]).json()["id"]
    for method in ("GET", "DELETE"):
        error = _error(served.call(method, made, KEYS[1]), 404)
        assert error["code"] == "response_not_found"
    chained = served.post({"input": "What is my secret?", "previous_response_id": made}, key=KEYS[1])
    assert _error(chained, 404)["param"] == "previous_response_id"
    assert served.call("GET", made, KEYS[0]).status_code == 200  # still there for its own key
    assert served.post({"input": "And?", "previous_response_id": made}, key=KEYS[0]).status_code == 200
    assert served.call("DELETE", made, KEYS[0]).status_code == 200


def test_a_huge_unknown_id_is_not_echoed(served: Served) -> None:
    error = _error(served.call("GET", "r" * 6000, KEYS[0]), 404)
    assert len(json.dumps(error)) < 1000


# ---- the stream's snapshots ---------------------------------------------------------------------------------


def test_lifecycle_events_share_what_does_not_change() -> None:
    """Each lifecycle event deep-copied the whole response on the event loop (metadata and tools included); now
    only its output items are copied."""
    from omnistage.entrypoints.openai.responses.protocol import FunctionToolOut, ResponseObject
    from omnistage.entrypoints.openai.responses.stream import ResponseWriter

    response = ResponseObject(id="r", created_at=0, status="in_progress", model=MODEL, metadata={"k": "v"},
                              tools=[FunctionToolOut(name="f", parameters={"type": "object"})])
    writer = ResponseWriter(response, None)
    created, _ = writer.start()
    assert created.response.metadata is response.metadata and created.response.tools is response.tools
    writer._text("hello")
    assert created.response.output == [] and created.response.status == "in_progress"
