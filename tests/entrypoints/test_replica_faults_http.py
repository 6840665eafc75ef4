"""A stage replica process killed during a load of HTTP streams: each stream ends with an error event,
the server answers 503 with Retry-After while the stage has no replica, /health shows it, and once the
replica is restarted the server serves again. Stage processes run the fake workers (no model)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import pytest

from omnistage.core import OmniRequest
from omnistage.entrypoints.openai.api_server import build_app
from omnistage.entrypoints.openai.server_config import MediaPolicy, ServerLimits
from omnistage.pipeline.async_omni import AsyncOmni
from omnistage.pipeline.request_state import OutputSink
from omnistage.pipeline.runtime import PipelineOptions, PipelineRuntime
from omnistage.families.base import FrontEnd
from omnistage.families.qwen3_omni.prompt import Qwen3OmniPromptProcessor
from omnistage.sampling_params import SamplingParams
from tests.entrypoints.fake_engine import fake_front_end
from tests.entrypoints.server_thread import ServerThread
from tests.pipeline import fakes
from tests.pipeline.specs import small_spec

pytestmark = pytest.mark.e2e
STREAMS = 6


@dataclass
class _FakeStagePipeline:
    """What AsyncOmni needs of a pipeline, over fake stage workers in real replica processes."""

    runtime: PipelineRuntime
    front_end: FrontEnd
    model_name: str = "fake-omni"
    supports_audio: bool = True
    max_model_len: int = 4096
    default_sampling: SamplingParams = SamplingParams()

    def submit(self, request: OmniRequest, sink: OutputSink) -> None:
        self.runtime.orchestrator.submit(request, sink)

    def abort(self, request_id: str) -> None:
        self.runtime.orchestrator.abort(request_id)

    def health(self):  # noqa: ANN201 - HealthReport
        return self.runtime.orchestrator.health()

    def stats(self):  # noqa: ANN201 - EngineStats
        return self.runtime.orchestrator.stats()

    def close(self) -> None:
        self.runtime.close()


@pytest.fixture()
def served(processor: Qwen3OmniPromptProcessor) -> Iterator[tuple[str, PipelineRuntime]]:
    runtime = PipelineRuntime(fakes.omni_graph(small_spec(talker_frames=100_000)), fakes.fake_factories(thinker_step_s=0.02), None,
                              fakes.AUDIO, PipelineOptions(talker_min_new_tokens=100_000))
    engine = AsyncOmni(pipeline=_FakeStagePipeline(runtime, fake_front_end(processor, audio=fakes.AUDIO)))
    thread = ServerThread(build_app(engine, ServerLimits(), MediaPolicy()))
    try:
        yield thread.start(), runtime
    finally:
        thread.stop()
        runtime.close()


async def _stream(client: httpx.AsyncClient, url: str, started: asyncio.Event, counter: list[int]) -> list[str]:
    body = {"model": "fake-omni", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2000,
            "stream": True, "modalities": ["text", "audio"], "audio": {"voice": "Ethan", "format": "pcm16"}}
    events = []
    async with client.stream("POST", f"{url}/v1/chat/completions", json=body) as response:
        assert response.status_code == 200
        async for line in response.aiter_lines():
            if line.startswith("data: "):
                events.append(line[6:])
                if len(events) == 3:  # the role delta and two engine outputs: it is in the pipeline
                    counter.append(1)
                    if len(counter) == STREAMS:
                        started.set()
    return events


def test_killed_thinker_during_http_streams(served: tuple[str, PipelineRuntime]) -> None:
    url, runtime = served
    thinker = runtime.orchestrator.links[("thinker", 0)]

    async def scenario() -> list[list[str]]:
        started, counter = asyncio.Event(), []
        async with httpx.AsyncClient(timeout=60) as client:
            tasks = [asyncio.ensure_future(_stream(client, url, started, counter)) for _ in range(STREAMS)]
            await asyncio.wait_for(started.wait(), 30)
            os.kill(thinker.handle.pid, signal.SIGKILL)
            results = await asyncio.wait_for(asyncio.gather(*tasks), 30)
            # The only thinker is gone: refused at once with 503 and Retry-After until it is back.
            refused = await client.post(f"{url}/v1/chat/completions",
                                        json={"model": "fake-omni", "messages": [{"role": "user", "content": "x"}]})
            assert refused.status_code == 503, refused.text
            assert int(refused.headers["retry-after"]) >= 1
            assert (await client.get(f"{url}/health")).status_code == 503
            return results

    results = asyncio.run(scenario())
    for events in results:
        last = json.loads(events[-1])
        assert "replica 0" in last["error"]["message"] and last["error"]["type"] == "server_error"
        assert last["error"]["code"] == "engine_error"  # a code to branch on: retry once /health is 200
    deadline = time.monotonic() + 60
    while httpx.get(f"{url}/health", timeout=10).status_code != 200:
        assert time.monotonic() < deadline, "the thinker was not restarted"
        time.sleep(0.2)
    health = httpx.get(f"{url}/health", timeout=10).json()
    thinker_health = next(s for s in health["stages"] if s["stage"] == "thinker")["replicas"][0]
    assert thinker_health["healthy"] and thinker_health["detail"] == "restarted 1 time(s)"
    reply = httpx.post(f"{url}/v1/chat/completions", timeout=30,
                       json={"model": "fake-omni", "messages": [{"role": "user", "content": "x"}], "max_tokens": 3})
    assert reply.status_code == 200, reply.text
