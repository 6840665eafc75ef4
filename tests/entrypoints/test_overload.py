"""Overload and deadlines: past --max-queued-requests a request gets 429, while a stage is down 503, both with
Retry-After and at once; past --request-timeout a request is aborted (504, or an error event mid-stream)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator

import httpx
import pytest

from omnistage.entrypoints.openai.api_server import build_app
from omnistage.entrypoints.openai.server_config import MediaPolicy, ServerLimits
from tests.entrypoints.fake_engine import FakeEngine, RecordingProcessor, fake_front_end
from tests.entrypoints.server_thread import ServerThread

MAX_REQUESTS = 3
CHAT = {"model": "fake-omni", "messages": [{"role": "user", "content": "hi"}]}
SPEECH = {"model": "fake-omni", "input": "hi", "voice": "Ethan"}
# Media no decoder can read: answered 400 once looked at, so a 429 for them says nothing was fetched or decoded
# before admission (item 2 of issue 28: an overloaded server spends no pool job on a body it will not serve).
NOT_AN_IMAGE = "data:image/png;base64," + "QUJD" * 1000
CHAT_MEDIA = {"model": "fake-omni", "messages": [{"role": "user", "content": [
    {"type": "image_url", "image_url": {"url": NOT_AN_IMAGE}},
    {"type": "input_audio", "input_audio": {"data": "not base64!", "format": "wav"}}]}]}
RESPONSES_MEDIA = {"model": "fake-omni", "input": [{"role": "user", "content": [
    {"type": "input_image", "image_url": NOT_AN_IMAGE}]}]}


@pytest.fixture()
def server(processor: RecordingProcessor, request: pytest.FixtureRequest) -> Iterator[tuple[str, FakeEngine]]:
    """A server with MAX_REQUESTS slots and a 60 s request timeout, or the one parametrized indirectly."""
    limits = ServerLimits(max_queued_requests=MAX_REQUESTS, request_timeout=getattr(request, "param", 60.0))
    engine = FakeEngine(fake_front_end(processor))
    thread = ServerThread(build_app(engine, limits, MediaPolicy()))
    url = thread.start()
    yield url, engine
    thread.stop()


async def _stream_until_first_delta(client: httpx.AsyncClient, url: str, release: asyncio.Event) -> int:
    async with client.stream("POST", f"{url}/v1/chat/completions", json={**CHAT, "stream": True}) as response:
        async for line in response.aiter_lines():  # leaving this loop early would close the connection
            if line.startswith("data:"):
                await release.wait()  # hold the request open until the test says so
                return response.status_code
    return -1


def test_past_the_limit_new_requests_get_429_with_retry_after_and_the_slots_come_back(
        server: tuple[str, FakeEngine]) -> None:
    url, engine = server
    engine.delay_s = 30.0  # the held streams produce nothing until their clients leave

    async def scenario() -> None:
        release = asyncio.Event()
        async with httpx.AsyncClient(timeout=20) as client:
            holders = [asyncio.ensure_future(_stream_until_first_delta(client, url, release))
                       for _ in range(MAX_REQUESTS)]
            while len(engine.requests) < MAX_REQUESTS:
                await asyncio.sleep(0.01)
            for path, body in (("/v1/chat/completions", CHAT), ("/v1/chat/completions", {**CHAT, "stream": True}),
                               ("/v1/audio/speech", SPEECH), ("/v1/chat/completions", CHAT_MEDIA),
                               ("/v1/responses", RESPONSES_MEDIA)):
                refused = await client.post(f"{url}{path}", json=body)
                assert refused.status_code == 429, refused.text
                assert int(refused.headers["retry-after"]) >= 1
                assert refused.json()["error"]["code"] == "overloaded"
            engine.delay_s = 0.0
            release.set()
            assert await asyncio.gather(*holders) == [200] * MAX_REQUESTS
            # The slots are free again (the streams ended or were left): new requests are served.
            for _ in range(50):
                ok = await client.post(f"{url}/v1/chat/completions", json={**CHAT, "max_tokens": 1})
                if ok.status_code == 200:
                    break
                await asyncio.sleep(0.1)
            assert ok.status_code == 200, ok.text
            for path, body in (("/v1/chat/completions", CHAT_MEDIA), ("/v1/responses", RESPONSES_MEDIA)):
                looked_at = await client.post(f"{url}{path}", json=body)  # admitted: the media error, slot back
                assert looked_at.status_code == 400, looked_at.text
            assert (await client.post(f"{url}/v1/chat/completions", json={**CHAT, "max_tokens": 1})).status_code == 200

    asyncio.run(scenario())
    assert len(engine.requests) == MAX_REQUESTS + 2  # the refused ones never reached the engine


def test_while_a_stage_is_down_requests_get_503_with_retry_after(server: tuple[str, FakeEngine]) -> None:
    url, engine = server
    engine.healthy = False
    for path, body in (("/v1/chat/completions", CHAT), ("/v1/audio/speech", SPEECH)):
        response = httpx.post(f"{url}{path}", json=body, timeout=10)
        assert response.status_code == 503
        assert int(response.headers["retry-after"]) >= 1
        error = response.json()["error"]
        assert error["code"] == "stage_unavailable" and "thinker" in error["message"]
    assert engine.requests == []
    engine.healthy = True
    assert httpx.post(f"{url}/v1/chat/completions", json=CHAT, timeout=10).status_code == 200


@pytest.mark.parametrize("server", [1.0], indirect=True)
def test_a_request_past_its_deadline_is_aborted(server: tuple[str, FakeEngine]) -> None:
    url, engine = server
    engine.delay_s = 0.4  # six deltas: 2.4 s, past the 1 s deadline
    whole = httpx.post(f"{url}/v1/chat/completions", json=CHAT, timeout=10)
    assert whole.status_code == 504 and whole.json()["error"]["code"] == "timeout"
    with httpx.stream("POST", f"{url}/v1/chat/completions", json={**CHAT, "stream": True}, timeout=10) as response:
        events = [line[6:] for line in response.iter_lines() if line.startswith("data: ")]
    assert json.loads(events[-1])["error"]["code"] == "timeout"
    speech = {**SPEECH, "stream_format": "sse"}
    with httpx.stream("POST", f"{url}/v1/audio/speech", json=speech, timeout=10) as response:
        events = [line[6:] for line in response.iter_lines() if line.startswith("data: ")]
    assert json.loads(events[-1])["error"]["code"] == "timeout"
    assert len(engine.aborted) == 3 and set(engine.aborted) == {r.request_id for r in engine.requests}
    engine.delay_s = 0.0
    assert httpx.post(f"{url}/v1/chat/completions", json=CHAT, timeout=10).status_code == 200
