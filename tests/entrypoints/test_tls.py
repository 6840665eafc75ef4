"""The serve flags that become uvicorn settings: ``--ssl-keyfile/--ssl-certfile`` (https:// and wss:// with a self-signed
certificate made for the test), and the WebSocket bounds."""

from __future__ import annotations

import asyncio
import json
import shutil
import ssl
import subprocess
from pathlib import Path

import httpx
import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from omnistage.entrypoints.cli import build_parser
from omnistage.entrypoints.openai.api_server import build_app
from omnistage.entrypoints.openai.serve_command import uvicorn_options
from omnistage.entrypoints.serve_config import ServeConfig
from omnistage.entrypoints.openai.server_config import AccessPolicy, limits_from_args
from tests.entrypoints.fake_engine import FakeEngine, RecordingProcessor, fake_front_end
from tests.entrypoints.server_thread import ServerThread


@pytest.fixture(scope="module")
def cert(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    if shutil.which("openssl") is None:
        pytest.skip("needs the openssl command to make a certificate")
    folder = tmp_path_factory.mktemp("tls")
    key, crt = folder / "key.pem", folder / "cert.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(crt),
                    "-days", "1", "-subj", "/CN=localhost", "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost"],
                   check=True, capture_output=True)
    return key, crt


def test_https_and_wss_with_the_serve_flags(processor: RecordingProcessor, cert: tuple[Path, Path]) -> None:
    key, crt = cert
    args = build_parser().parse_args(["serve", "--ssl-keyfile", str(key), "--ssl-certfile", str(crt),
                                      "--api-key", "sk-tls"])
    thread = ServerThread(build_app(FakeEngine(fake_front_end(processor)), limits_from_args(args),
                                    access=AccessPolicy(api_keys=("sk-tls",))),
                          **uvicorn_options(ServeConfig.from_args(args)))
    url = thread.start()
    try:
        assert url.startswith("https://")
        trust = ssl.create_default_context(cafile=str(crt))
        r = httpx.get(f"{url}/v1/models", headers={"Authorization": "Bearer sk-tls"}, verify=trust, timeout=10)
        assert r.status_code == 200 and r.json()["data"][0]["id"] == "fake-omni"
        with pytest.raises(httpx.ConnectError):  # a client that does not trust it refuses it
            httpx.get(f"{url}/health", timeout=10)

        async def session() -> str:
            wss = url.replace("https://", "wss://") + "/v1/realtime"
            async with connect(wss, ssl=trust, subprotocols=["realtime", "openai-insecure-api-key.sk-tls"],
                               open_timeout=10) as ws:
                return json.loads(await asyncio.wait_for(ws.recv(), 10))["type"]

        assert asyncio.run(session()) == "session.created"
    finally:
        thread.stop()


def test_websockets_are_bounded_and_uncompressed_with_the_serve_flags(processor: RecordingProcessor) -> None:
    """No permessage-deflate (inflating frames ran on the event loop), and a message past
    --max-ws-message-bytes closes the socket with 1009 (message too big)."""
    args = build_parser().parse_args(["serve", "--max-ws-message-bytes", "65536"])
    thread = ServerThread(build_app(FakeEngine(fake_front_end(processor)), limits_from_args(args)),
                          **uvicorn_options(ServeConfig.from_args(args)))
    url = thread.start()
    try:
        async def session() -> tuple[str | None, int | None]:
            async with connect(url.replace("http://", "ws://") + "/v1/realtime", open_timeout=10) as ws:
                extensions = ws.response.headers.get("Sec-WebSocket-Extensions")  # the client offers deflate
                await asyncio.wait_for(ws.recv(), 10)  # session.created
                await ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": "A" * 70_000}))
                with pytest.raises(ConnectionClosed):
                    await asyncio.wait_for(ws.recv(), 10)
                return extensions, ws.close_code

        extensions, code = asyncio.run(session())
        assert extensions is None and code == 1009
    finally:
        thread.stop()
