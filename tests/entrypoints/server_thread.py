"""Runs a FastAPI app under a real uvicorn server in a background thread, on a free port."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

import uvicorn
from fastapi import FastAPI

if TYPE_CHECKING:
    from omnistage.pipeline.async_omni import AsyncOmni


class ServerThread:
    def __init__(self, app: FastAPI, **config_options: object) -> None:
        # Port 0: the OS picks a free port, read back once the socket is bound (no race with other tests).
        options: dict[str, object] = {"lifespan": "off", **config_options}  # lifespan="on": the loop-lag watcher
        config = uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", **options)
        self.scheme = "https" if config_options.get("ssl_certfile") else "http"
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def start(self, timeout_s: float = 10.0) -> str:
        self.thread.start()
        deadline = time.monotonic() + timeout_s
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("uvicorn did not start")
            time.sleep(0.01)
        port = self.server.servers[0].sockets[0].getsockname()[1]
        return f"{self.scheme}://127.0.0.1:{port}"

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)


@contextmanager
def serving(engine: AsyncOmni, **app_options: object) -> Iterator[str]:
    """The OpenAI server on a loaded pipeline (``build_app``'s options), in a thread: its URL while the block runs,
    then the server stopped and the pipeline shut down."""
    from omnistage.entrypoints.openai.api_server import build_app

    thread = ServerThread(build_app(engine, **app_options))
    try:
        yield thread.start()
    finally:
        thread.stop()
        asyncio.run(engine.shutdown())
