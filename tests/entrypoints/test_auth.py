"""``--api-key``, ``--protect-metrics``, WebSocket Origin and loopback Host checks, against a live server."""

from __future__ import annotations

import argparse
import asyncio
import json
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import openai
import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidStatus

from omnistage.entrypoints.cli import build_parser
from omnistage.entrypoints.openai.api_server import build_app
from omnistage.entrypoints.openai.server_config import AccessPolicy, access_policy_from_args
from tests.entrypoints.conftest import TEST_LIMITS
from tests.entrypoints.fake_engine import FakeEngine, RecordingProcessor, fake_front_end
from tests.entrypoints.server_thread import ServerThread

KEY = "sk-test-0123456789"
ALLOWED_ORIGIN = "https://voice.example"


@dataclass
class Guarded:
    url: str
    engine: FakeEngine

    @property
    def ws(self) -> str:
        return self.url.replace("http://", "ws://") + "/v1/realtime"


def _serve(processor: RecordingProcessor, policy: AccessPolicy) -> Iterator[Guarded]:
    engine = FakeEngine(fake_front_end(processor))
    thread = ServerThread(build_app(engine, TEST_LIMITS, access=policy))
    url = thread.start()
    yield Guarded(url, engine)
    thread.stop()


@pytest.fixture(scope="module")
def guarded(processor: RecordingProcessor) -> Iterator[Guarded]:
    yield from _serve(processor, AccessPolicy(api_keys=(KEY, "sk-second"), allowed_origins=(ALLOWED_ORIGIN,),
                                              allowed_hosts=frozenset({"localhost", "127.0.0.1", "::1"})))


def _auth(key: str = KEY) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


# /, /docs, /redoc, /openapi.json and the docs' assets are open (no secrets; a browser cannot send a key with a
# page it opens): tests/entrypoints/test_landing.py.
@pytest.mark.parametrize("path", ["/v1/models", "/v1/models/fake-omni", "/v1/audio/voices", "/metrics/x",
                                  "/v1/nothing"])
@pytest.mark.parametrize("headers", [{}, _auth("sk-wrong"), {"Authorization": KEY}, {"Authorization": "Basic x"}],
                         ids=["none", "wrong", "no-scheme", "basic"])
def test_every_route_needs_the_key(guarded: Guarded, path: str, headers: dict[str, str]) -> None:
    r = httpx.get(guarded.url + path, headers=headers, timeout=10)
    assert r.status_code == 401, r.text
    assert r.headers["www-authenticate"] == "Bearer"
    error = r.json()["error"]
    assert error["type"] == "invalid_request_error" and error["code"] == "invalid_api_key"
    assert "sk-wrong" not in error["message"]


def test_the_key_opens_every_route(guarded: Guarded) -> None:
    for key in (KEY, "sk-second"):
        for path in ("/v1/models", "/docs", "/openapi.json"):
            assert httpx.get(guarded.url + path, headers=_auth(key), timeout=10).status_code == 200
    client = openai.OpenAI(base_url=f"{guarded.url}/v1", api_key=KEY, max_retries=0, timeout=20)
    reply = client.chat.completions.create(model="fake-omni", messages=[{"role": "user", "content": "hi"}])
    assert reply.choices[0].message.content
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=f"{guarded.url}/v1", api_key="sk-nope", max_retries=0).models.list()


def test_health_and_metrics_stay_open(guarded: Guarded) -> None:
    assert httpx.get(f"{guarded.url}/health", timeout=10).status_code == 200
    assert httpx.get(f"{guarded.url}/metrics", timeout=10).status_code == 200


def test_a_refused_body_is_not_read(guarded: Guarded) -> None:
    """Over the body limit and without a key: 401, not 413, and nothing reached the engine."""
    guarded.engine.requests.clear()
    r = httpx.post(f"{guarded.url}/v1/chat/completions", content=b"x" * (TEST_LIMITS.max_request_bytes + 10),
                   timeout=30)
    assert r.status_code == 401
    assert guarded.engine.requests == []


def test_protect_metrics(processor: RecordingProcessor) -> None:
    for server in _serve(processor, AccessPolicy(api_keys=(KEY,), protect_metrics=True)):
        assert httpx.get(f"{server.url}/metrics", timeout=10).status_code == 401
        assert httpx.get(f"{server.url}/metrics", headers=_auth(), timeout=10).status_code == 200
        assert httpx.get(f"{server.url}/health", timeout=10).status_code == 200


async def _session_created(url: str, **kwargs: object) -> tuple[dict, str | None]:
    async with connect(url, open_timeout=10, **kwargs) as ws:
        event = json.loads(await asyncio.wait_for(ws.recv(), 10))
        return event, ws.subprotocol


async def _refused(url: str, **kwargs: object) -> tuple[int, dict]:
    with pytest.raises(InvalidStatus) as info:
        async with connect(url, open_timeout=10, **kwargs):
            pass
    response = info.value.response
    return response.status_code, json.loads(response.body)


def test_websocket_needs_the_key(guarded: Guarded) -> None:
    async def run() -> None:
        status, body = await _refused(guarded.ws)
        assert status == 401 and body["error"]["code"] == "invalid_api_key"
        status, _ = await _refused(guarded.ws, additional_headers=_auth("sk-wrong"))
        assert status == 401
        status, _ = await _refused(guarded.ws, subprotocols=["realtime", "openai-insecure-api-key.sk-wrong"])
        assert status == 401
        # The header form, and the browser SDKs' subprotocol form (the server answers "realtime", as OpenAI).
        event, protocol = await _session_created(guarded.ws, additional_headers=_auth())
        assert event["type"] == "session.created" and protocol is None
        event, protocol = await _session_created(
            guarded.ws, subprotocols=["realtime", f"openai-insecure-api-key.{KEY}", "openai-beta.realtime-v1"])
        assert event["type"] == "session.created" and protocol == "realtime"

    asyncio.run(run())


def test_websocket_origin_is_checked(guarded: Guarded) -> None:
    port = guarded.url.rsplit(":", 1)[1]

    async def run() -> None:
        status, body = await _refused(guarded.ws, additional_headers=_auth(), origin="https://evil.example")
        assert status == 403 and body["error"]["code"] == "origin_not_allowed"
        status, _ = await _refused(guarded.ws, additional_headers=_auth(), origin=f"http://evil.example:{port}")
        assert status == 403
        for origin in (ALLOWED_ORIGIN, f"http://127.0.0.1:{port}", None):  # listed, same origin, not a browser
            event, _ = await _session_created(guarded.ws, additional_headers=_auth(), origin=origin)
            assert event["type"] == "session.created", origin

    asyncio.run(run())


def test_loopback_server_answers_only_loopback_hosts(guarded: Guarded) -> None:
    """DNS rebinding: a page at evil.example whose name now resolves to 127.0.0.1 sends Host: evil.example."""
    port = guarded.url.rsplit(":", 1)[1]
    r = httpx.get(f"{guarded.url}/v1/models", headers={**_auth(), "Host": f"evil.example:{port}"}, timeout=10)
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_host"
    assert httpx.get(f"{guarded.url}/v1/models", headers={**_auth(), "Host": f"localhost:{port}"},
                     timeout=10).status_code == 200

    async def run() -> None:
        # The URL's name goes into the Host header; the socket still goes to the server's loopback port.
        status, body = await _refused(f"ws://evil.example:{port}/v1/realtime", additional_headers=_auth(),
                                      host="127.0.0.1", port=int(port))
        assert status == 400 and body["error"]["code"] == "invalid_host"

    asyncio.run(run())


def _args(*flags: str) -> argparse.Namespace:
    return build_parser().parse_args(["serve", *flags])


def test_access_flags() -> None:
    policy = access_policy_from_args(_args(), environ={})
    assert policy.api_keys == () and policy.allowed_hosts == frozenset({"localhost", "127.0.0.1", "::1"})
    assert access_policy_from_args(_args(), environ={"OMNISTAGE_API_KEY": "k1"}).api_keys == ("k1",)
    policy = access_policy_from_args(_args("--api-key", "a", "--api-key", "b", "--host", "0.0.0.0",
                                           "--allowed-origins", "https://x.example/, https://y.example",
                                           "--protect-metrics"), environ={"OMNISTAGE_API_KEY": "k1"})
    assert policy.api_keys == ("a", "b") and policy.allowed_hosts is None and policy.protect_metrics
    assert policy.allowed_origins == ("https://x.example", "https://y.example")
    assert access_policy_from_args(_args("--allowed-hosts", "*"), environ={}).allowed_hosts is None
    with pytest.raises(ValueError, match="ssl"):
        access_policy_from_args(_args("--ssl-keyfile", "k.pem"), environ={})
