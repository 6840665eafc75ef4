"""Ephemeral keys: ``POST /v1/realtime/client_secrets`` mints a short-lived, single-use key that opens one
realtime session with the settings it was minted with, and nothing else."""

from __future__ import annotations

from collections.abc import Iterator

import openai
import pytest
from fastapi.testclient import TestClient
from openai.types.realtime import ClientSecretCreateResponse
from starlette.websockets import WebSocketDisconnect

from omnistage.entrypoints.openai.api_server import build_app
from omnistage.entrypoints.openai.common.ephemeral_keys import EphemeralKeys
from omnistage.entrypoints.openai.server_config import AccessPolicy
from tests.entrypoints.conftest import TEST_LIMITS
from tests.entrypoints.fake_engine import FakeEngine, RecordingProcessor, fake_front_end

KEY = "sk-ephemeral-0123456789"
AUTH = {"Authorization": f"Bearer {KEY}"}
SESSION = {"type": "realtime", "instructions": "Answer like a pirate.", "output_modalities": ["text"],
           "audio": {"output": {"voice": "Ethan"}}}


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_the_store_hands_each_key_out_once_until_it_expires() -> None:
    clock = Clock()
    keys = EphemeralKeys(capacity=2, clock=clock)
    first = keys.mint({"instructions": "a"}, ttl_s=60)
    assert first.value.startswith("ek_") and first.expires_at == 1060
    claimed = keys.hold(first.value)
    assert claimed is not None and claimed.session == {"instructions": "a"}
    keys.spend(claimed)
    assert keys.hold(first.value) is None  # used once
    late = keys.mint({}, ttl_s=10)
    clock.now += 10
    assert keys.hold(late.value) is None  # expired
    with pytest.raises(ValueError, match="between 10 and 7200"):
        keys.mint({}, ttl_s=5)


def test_a_held_key_is_refused_to_others_and_usable_again_once_released() -> None:
    keys = EphemeralKeys()
    key = keys.mint({"instructions": "a"})
    held = keys.hold(key.value)
    assert held is not None and keys.hold(key.value) is None  # a second request meanwhile is refused
    keys.release(held)  # its request failed before its session was set up
    again = keys.hold(key.value)
    assert again is not None
    keys.spend(again)
    assert keys.hold(key.value) is None and len(keys) == 0


def test_the_store_is_bounded() -> None:
    keys = EphemeralKeys(capacity=2)
    minted = [keys.mint({}) for _ in range(5)]
    assert len(keys) == 2
    assert keys.hold(minted[0].value) is None and keys.hold(minted[-1].value) is not None


@pytest.fixture(scope="module")
def client(processor: RecordingProcessor) -> Iterator[TestClient]:
    app = build_app(FakeEngine(fake_front_end(processor)), TEST_LIMITS, access=AccessPolicy(api_keys=(KEY,)))
    with TestClient(app) as test_client:
        yield test_client


def mint(client: TestClient, session: dict[str, object] | None = None, **extra: object) -> dict[str, object]:
    r = client.post("/v1/realtime/client_secrets", headers=AUTH, json={"session": session or SESSION, **extra})
    assert r.status_code == 200, r.text
    return r.json()


def test_minting_answers_openai_shape_through_the_sdk(client: TestClient) -> None:
    sdk = openai.OpenAI(base_url="http://testserver/v1", api_key=KEY, http_client=client, max_retries=0)
    secret = sdk.realtime.client_secrets.create(session=SESSION, expires_after={"anchor": "created_at",
                                                                                 "seconds": 60})
    assert isinstance(secret, ClientSecretCreateResponse) and secret.value.startswith("ek_")
    assert secret.session.type == "realtime" and secret.session.instructions == "Answer like a pirate."
    assert secret.session.audio.output.voice == "Ethan"  # type: ignore[union-attr]


def test_the_key_opens_one_websocket_session_with_its_settings(client: TestClient) -> None:
    value = mint(client)["value"]
    with client.websocket_connect("/v1/realtime", subprotocols=["realtime", f"openai-insecure-api-key.{value}"]) as ws:
        created = ws.receive_json()
    assert created["type"] == "session.created"
    assert created["session"]["instructions"] == "Answer like a pirate."
    assert created["session"]["output_modalities"] == ["text"]
    with pytest.raises(WebSocketDisconnect), client.websocket_connect(
            "/v1/realtime", headers={"Authorization": f"Bearer {value}"}) as ws:
        ws.receive_json()  # used once: the second handshake is refused


def test_a_websocket_refused_before_its_session_leaves_the_key_unspent(client: TestClient) -> None:
    """Spent only by a session that was set up: a handshake refused for its model leaves the key usable."""
    value = mint(client)["value"]
    protocols = ["realtime", f"openai-insecure-api-key.{value}"]
    with client.websocket_connect("/v1/realtime?model=nobody", subprotocols=protocols) as ws:
        assert ws.receive_json()["error"]["code"] == "model_not_found"
    with client.websocket_connect("/v1/realtime", subprotocols=protocols) as ws:
        assert ws.receive_json()["type"] == "session.created"


def test_the_key_opens_nothing_else_and_cannot_mint(client: TestClient) -> None:
    value = mint(client)["value"]
    bearer = {"Authorization": f"Bearer {value}"}
    assert client.get("/v1/models", headers=bearer).status_code == 401
    assert client.post("/v1/realtime/client_secrets", headers=bearer, json={}).status_code == 401
    assert client.post("/v1/chat/completions", headers=bearer, json={}).status_code == 401
    assert client.post("/v1/realtime/client_secrets", json={}).status_code == 401  # the real key guards minting


def test_bad_settings_are_refused_at_minting(client: TestClient) -> None:
    r = client.post("/v1/realtime/client_secrets", headers=AUTH,
                    json={"session": {"type": "realtime", "audio": {"output": {"voice": "nobody"}}}})
    assert r.status_code == 400 and r.json()["error"]["param"] == "session.audio.output.voice"
    r = client.post("/v1/realtime/client_secrets", headers=AUTH,
                    json={"session": {"type": "realtime"}, "expires_after": {"seconds": 99999}})
    assert r.status_code == 400
    r = client.post("/v1/realtime/client_secrets", headers=AUTH, json={"session": {"model": "other"}})
    assert r.status_code == 404


def test_an_unknown_ephemeral_key_is_a_401(client: TestClient) -> None:
    with pytest.raises(WebSocketDisconnect), client.websocket_connect(
            "/v1/realtime", headers={"Authorization": "Bearer ek_made_up"}) as ws:
        ws.receive_json()
