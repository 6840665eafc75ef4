"""What the TTS families' served tests share: a live in-process server of a checkpoint, the OpenAI client, and the
streamed-against-whole checks of /v1/audio/speech."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
from collections.abc import Iterator

import numpy as np
import openai

from omnistage.entrypoints.openai.api_server import build_app
from omnistage.pipeline.async_omni import AsyncOmni
from omnistage.pipeline.runtime import PipelineOptions
from tests.entrypoints.server_thread import ServerThread


@contextlib.contextmanager
def serving(folder, name: str, **app_options) -> Iterator[str]:  # noqa: ANN001
    """A live server of ``folder`` (in-process stages) served as ``name``: its URL."""
    engine = AsyncOmni(folder, None, PipelineOptions(in_process=True), name)
    thread = ServerThread(build_app(engine, **app_options))
    try:
        yield thread.start()
    finally:
        thread.stop()
        asyncio.run(engine.shutdown())


def openai_client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0)


def same_pcm(a: bytes, b: bytes) -> None:
    """Chunk boundaries differ between a streamed and a whole response: float rounding may flip a pcm16 LSB."""
    x, y = np.frombuffer(a, "<i2").astype(int), np.frombuffer(b, "<i2").astype(int)
    assert x.shape == y.shape and np.abs(x - y).max() <= 1


def sse_joins_to_the_whole(url: str, model: str, voice: str, text: str) -> None:
    client = openai_client(url)
    whole = client.audio.speech.create(model=model, voice=voice, input=text, response_format="pcm").content
    with client.audio.speech.with_streaming_response.create(model=model, voice=voice, input=text,
                                                            response_format="pcm", stream_format="sse") as r:
        events = [json.loads(line[len("data: "):]) for line in r.iter_lines() if line.startswith("data: ")]
    deltas = [base64.b64decode(e["audio"]) for e in events if e["type"] == "speech.audio.delta"]
    assert len(deltas) >= 2
    same_pcm(b"".join(deltas), whole)


def streamed_bytes_join_to_the_whole(url: str, model: str, voice: str, text: str) -> None:
    client = openai_client(url)
    whole = client.audio.speech.create(model=model, voice=voice, input=text, response_format="pcm").content
    with client.audio.speech.with_streaming_response.create(model=model, voice=voice, input=text,
                                                            response_format="pcm") as r:
        same_pcm(b"".join(r.iter_bytes()), whole)
