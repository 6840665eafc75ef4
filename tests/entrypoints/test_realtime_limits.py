"""``WS /v1/realtime`` under the server's limits: a ``response.create`` takes an admission place like an HTTP
request (refused with an ``error`` event when full, the socket stays usable) and runs under --request-timeout."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import httpx
import pytest

from omnistage.entrypoints.openai.api_server import build_app
from omnistage.entrypoints.openai.server_config import MediaPolicy, ServerLimits
from tests.entrypoints.fake_engine import FakeEngine, RecordingProcessor, fake_front_end
from tests.entrypoints.server_thread import ServerThread
from tests.entrypoints.test_realtime import open_session, send, until

MAX_REQUESTS = 1
USER_ITEM = {"type": "conversation.item.create",
             "item": {"role": "user", "content": [{"type": "input_text", "text": "hi"}]}}


class _Server:
    def __init__(self, base_url: str, engine: FakeEngine) -> None:
        self.base_url, self.engine = base_url, engine


@pytest.fixture()
def server(processor: RecordingProcessor, request: pytest.FixtureRequest) -> Iterator[_Server]:
    """One admission place; a 60 s request timeout unless parametrized indirectly."""
    limits = ServerLimits(max_queued_requests=MAX_REQUESTS, request_timeout=getattr(request, "param", 60.0))
    engine = FakeEngine(fake_front_end(processor))
    thread = ServerThread(build_app(engine, limits, MediaPolicy()))
    yield _Server(thread.start(), engine)
    thread.stop()


def test_past_the_limit_response_create_gets_an_error_event_and_the_socket_stays_usable(server: _Server) -> None:
    server.engine.delay_s = 0.2  # six words: the first response holds the only place for ~1.2 s

    async def scenario() -> None:
        async with await open_session(server, output_modalities=["text"]) as holder, \
                await open_session(server, output_modalities=["text"]) as refused:
            for ws in (holder, refused):
                await send(ws, USER_ITEM)
                await until(ws, "conversation.item.added")
            await send(holder, {"type": "response.create"})
            await until(holder, "response.created")
            await send(refused, {"type": "response.create", "event_id": "evt_1"})
            error, before = await until(refused, "error")
            assert error["error"]["code"] == "overloaded" and error["error"]["type"] == "server_error"
            assert error["error"]["event_id"] == "evt_1" and "retry" in error["error"]["message"]
            assert not any(e["type"].startswith("response.") for e in before)  # no response was started
            # HTTP requests share the same bound while the realtime response holds it.
            async with httpx.AsyncClient(timeout=10) as client:
                chat = await client.post(f"{server.base_url}/v1/chat/completions",
                                         json={"model": "fake-omni", "messages": [{"role": "user", "content": "hi"}]})
                assert chat.status_code == 429
            done, _ = await until(holder, "response.done")
            assert done["response"]["status"] == "completed"
            server.engine.delay_s = 0.0
            await send(refused, {"type": "response.create"})  # the place is back: the same socket is served
            done, _ = await until(refused, "response.done")
            assert done["response"]["status"] == "completed"
    asyncio.run(scenario())
    assert len(server.engine.requests) == 2  # the refused response never reached the engine


def test_while_a_stage_is_down_response_create_gets_stage_unavailable(server: _Server) -> None:
    server.engine.healthy = False

    async def scenario() -> None:
        async with await open_session(server, output_modalities=["text"]) as ws:
            await send(ws, USER_ITEM)
            await send(ws, {"type": "response.create"})
            error, _ = await until(ws, "error")
            assert error["error"]["code"] == "stage_unavailable" and "thinker" in error["error"]["message"]
    asyncio.run(scenario())
    assert not server.engine.requests


@pytest.mark.parametrize("server", [0.5], indirect=True)
def test_past_the_request_timeout_the_response_fails_and_is_aborted(server: _Server) -> None:
    server.engine.delay_s = 0.3  # six words take 1.8 s, past the 0.5 s deadline

    async def scenario() -> None:
        async with await open_session(server, output_modalities=["text"]) as ws:
            await send(ws, USER_ITEM)
            await send(ws, {"type": "response.create"})
            done, events = await until(ws, "response.done")
            response = done["response"]
            assert response["status"] == "failed"
            assert response["status_details"]["error"]["code"] == "timeout"
            assert "timed out after 0.5 s" in response["status_details"]["error"]["message"]
            assert any(e["type"] == "response.output_text.delta" for e in events)  # what came before it stays
            # The place came back with the abort: the socket serves the next response.
            server.engine.delay_s = 0.0
            await send(ws, {"type": "response.create"})
            done, _ = await until(ws, "response.done")
            assert done["response"]["status"] == "completed"
    asyncio.run(scenario())
    timed_out = server.engine.requests[0].request_id
    assert timed_out in server.engine.aborted and timed_out in server.engine.closed


def test_a_response_cancelled_at_once_is_reported_and_gives_its_place_back(server: _Server) -> None:
    server.engine.delay_s = 0.5

    async def scenario() -> None:
        async with await open_session(server, output_modalities=["text"]) as ws:
            await send(ws, USER_ITEM)
            for _ in range(3):  # cancelled before or just after the response task first ran
                await send(ws, {"type": "response.create"})
                await send(ws, {"type": "response.cancel"})
                done, events = await until(ws, "response.done")
                assert done["response"]["status"] == "cancelled"
                assert [e["type"] for e in events if e["type"].startswith("response.")] == ["response.created"]
            server.engine.delay_s = 0.0
            await send(ws, {"type": "response.create"})  # the one place is free again
            done, _ = await until(ws, "response.done")
            assert done["response"]["status"] == "completed"
    asyncio.run(scenario())
    assert all(rid in server.engine.aborted for rid in (r.request_id for r in server.engine.requests[:-1]))
