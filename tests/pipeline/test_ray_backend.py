"""The Ray backend on a local, loopback-only Ray cluster of two nodes (two raylets on this machine, one CPU each):
the tiny pipeline with two talker replicas, its thinker placed on the head node by a label and its talker and
code2wav on the other node by a custom resource and a label, serves text + audio through the OpenAI server
exactly as the local backend does (tensors cross "nodes" in the message frames, and through shared memory
where both ends share the head node); a killed talker actor fails only its own streams and is started again."""

from __future__ import annotations

import asyncio
import base64
import importlib.util
import json
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np
import openai
import pytest

from omnistage.config.pipeline import ConfigError, parse_pipeline
from omnistage.entrypoints.openai.api_server import build_app
from omnistage.pipeline.async_omni import AsyncOmni
from omnistage.pipeline.runtime import PipelineOptions
from tests.entrypoints.server_thread import ServerThread
from tests.pipeline.specs import RAY_LABEL, RAY_SLOT, two_node_dict, write_spec

pytestmark = [pytest.mark.e2e,
              pytest.mark.skipif(importlib.util.find_spec("ray") is None,
                                 reason="ray is not installed (pip install 'omnistage[ray]')")]
FRAMES = 400  # talker frames per request: long enough that streams are mid-way when an actor is killed
RESOURCE, LABEL = RAY_SLOT, RAY_LABEL  # the second node's resource; both nodes' label
STREAMS = 4


def _spec_dict() -> dict:
    return two_node_dict(FRAMES)


def _ray_children() -> list[int]:
    """This process's children that are Ray's: raylets, the GCS server, Ray's Python helpers."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)
            comm, ppid = fields[0].split("(", 1)[1], int(fields[1].split()[1])
            cmdline = (stat.parent / "cmdline").read_bytes().decode(errors="replace")
        except (OSError, IndexError, ValueError):
            continue
        if ppid == os.getpid() and (comm in ("raylet", "gcs_server") or "/ray/" in cmdline):
            found.append(int(stat.parent.name))
    return found


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[object]:
    # Loopback only: Ray's "no cluster" mode (what it uses on macOS) makes every address 127.0.0.1; it is
    # read when ray is first imported, so ray is imported here, not at the top of this module.
    with pytest.MonkeyPatch.context() as env:
        env.setenv("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
        env.setenv("RAY_USAGE_STATS_ENABLED", "0")
        import ray
        from ray.cluster_utils import Cluster

        cluster = Cluster(initialize_head=True, head_node_args={
            "num_cpus": 1, "labels": {LABEL: "head"}, "include_dashboard": False})
        try:
            cluster.add_node(num_cpus=1, resources={RESOURCE: 1}, labels={LABEL: "vocoder"})
            ray.init(address=cluster.address, log_to_driver=False)
            cluster.wait_for_nodes()
            yield ray
        finally:
            ray.shutdown()
            cluster.shutdown()
    deadline = time.monotonic() + 10
    while _ray_children() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _ray_children() == []


@dataclass
class _Served:
    url: str
    engine: AsyncOmni


def _serve(tiny_dir: Path, config: Path, backend: str) -> tuple[_Served, ServerThread]:
    options = PipelineOptions(talker_min_new_tokens=FRAMES, threads_per_replica=1, backend=backend)
    engine = AsyncOmni(tiny_dir, config, options, "tiny")
    thread = ServerThread(build_app(engine))
    return _Served(thread.start(), engine), thread


@pytest.fixture(scope="module")
def config(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_spec(tmp_path_factory.mktemp("stages"), _spec_dict())


@pytest.fixture(scope="module")
def on_ray(ray_cluster: object, tiny_dir: Path, config: Path) -> Iterator[_Served]:
    served, thread = _serve(tiny_dir, config, "ray")
    try:
        yield served
    finally:
        thread.stop()
        asyncio.run(served.engine.shutdown())


def _speak(url: str) -> tuple[str, bytes]:
    """One seeded, sampled text + audio answer, streamed: its text and its PCM16 bytes."""
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=120)
    stream = client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "Tell me about the sea."}],
        modalities=["text", "audio"], audio={"voice": "Ethan", "format": "pcm16"}, stream=True, max_tokens=24,
        seed=11, temperature=0.9)
    text, pcm = "", b""
    for chunk in stream:
        for choice in chunk.choices:
            text += choice.delta.content or ""
            audio = getattr(choice.delta, "audio", None)
            pcm += base64.b64decode(getattr(audio, "data", None) or "")
    return text, pcm


def test_placement_maps_to_ray_actor_options(ray_cluster: object) -> None:
    from omnistage.pipeline.ray_replica import actor_options

    spec = parse_pipeline(_spec_dict())
    assert actor_options(spec.stage("talker")) == {
        "num_cpus": 0.25, "num_gpus": 0.0, "max_restarts": 0, "resources": {RESOURCE: 0.5}}
    assert actor_options(spec.stage("code2wav"))["label_selector"] == {LABEL: "vocoder"}
    bad = _spec_dict()
    bad["stages"][2]["placement"]["node_labels"] = {"bad key!": "x"}
    with pytest.raises(ConfigError, match=r"^stages\[2\]\.placement: .*label"):
        actor_options(parse_pipeline(bad).stages[2], "stages[2].placement")
    bad["stages"][0]["device"] = "cuda"
    with pytest.raises(ConfigError, match=r"^stages\[0\]\.placement\.num_gpus: device 'cuda'"):
        actor_options(parse_pipeline(bad).stages[0], "stages[0].placement")


def test_ray_serves_the_same_text_and_audio_as_local_processes(tiny_dir: Path, config: Path,
                                                               on_ray: _Served) -> None:
    start = time.monotonic()
    local, thread = _serve(tiny_dir, config, "local")
    try:
        expected = _speak(local.url)
    finally:
        thread.stop()
        asyncio.run(local.engine.shutdown())
    local_s = time.monotonic() - start
    start = time.monotonic()
    got = _speak(on_ray.url)
    ray_s = time.monotonic() - start
    assert expected[0] and len(expected[1]) > FRAMES * 1920  # over half of FRAMES frames of 1920 PCM16 samples
    assert got[0] == expected[0]
    # Streamed chunk sizes follow each run's player timing; seamless chunks join into the same samples to
    # rounding, so the PCM16 values agree within one step.
    ours, theirs = (np.frombuffer(pcm, dtype=np.int16).astype(np.int32) for pcm in (got[1], expected[1]))
    assert ours.shape == theirs.shape and int(np.abs(ours - theirs).max()) <= 1
    links = on_ray.engine.pipeline.runtime.orchestrator.links
    assert sum(stage == "talker" for stage, _ in links) == 2
    # Tensors to the other node go in the frames; the thinker shares the head node's shared memory.
    runtime = on_ray.engine.pipeline.runtime
    assert all(link.sender.codec.store is None for (stage, _), link in links.items() if stage != "thinker")
    assert links[("thinker", 0)].sender.codec.store is runtime.store
    print(f"local backend (start + request) {local_s:.1f} s; ray backend request {ray_s:.1f} s")


def test_frames_and_chunks_never_cross_the_head(on_ray: _Served) -> None:
    """The talker and code2wav share the second node: the talker's chunks go to code2wav there, so the head sends
    code2wav nothing and hears from the talker only what it planned (its notices); the audio comes to the head,
    where the client is."""
    before = on_ray.engine.stats().crossings()
    _, pcm = _speak(on_ray.url)
    after = on_ray.engine.stats().crossings()
    seconds = len(pcm) / 2 / 24000
    per_s = {key: (after[key] - before.get(key, 0)) / seconds for key in after}
    print("bytes through the head per audio second: " + ", ".join(
        f"{stage} {way} {rate:,.0f}" for (stage, way), rate in sorted(per_s.items())))
    assert per_s[("code2wav", "to")] == 0  # no chunk job from the head
    assert per_s[("code2wav", "from")] >= 24000 * 4  # the client's audio (float32 samples) comes to the head
    # From the talker: a notice per step (request id, counts, cuts), far less than the audio it stands for.
    assert per_s[("talker", "from")] < 0.1 * per_s[("code2wav", "from")]


async def _stream(client: httpx.AsyncClient, url: str, producing: asyncio.Event, counter: list[str]
                  ) -> tuple[str, list[dict]]:
    """A long text + audio stream: its request id and every SSE event; counts itself once audio arrives."""
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 24, "stream": True,
            "modalities": ["text", "audio"], "audio": {"voice": "Ethan", "format": "pcm16"}}
    events: list[dict] = []
    async with client.stream("POST", f"{url}/v1/chat/completions", json=body) as response:
        assert response.status_code == 200
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            events.append(json.loads(line[6:]))
            delta = (events[-1].get("choices") or [{}])[0].get("delta") or {}
            if delta.get("audio") and events[0]["id"] not in counter:
                counter.append(events[0]["id"])
                if len(counter) == STREAMS:
                    producing.set()
    return events[0]["id"], events


def test_a_killed_talker_actor_fails_only_its_streams_and_comes_back(on_ray: _Served) -> None:
    ray = pytest.importorskip("ray")
    orchestrator = on_ray.engine.pipeline.runtime.orchestrator
    link = orchestrator.links[("talker", 0)]
    old_actor = link.handle.actor

    async def scenario() -> tuple[set[str], list[tuple[str, list[dict]]]]:
        producing, counter = asyncio.Event(), []
        async with httpx.AsyncClient(timeout=120) as client:
            tasks = [asyncio.ensure_future(_stream(client, on_ray.url, producing, counter)) for _ in range(STREAMS)]
            await asyncio.wait_for(producing.wait(), 60)
            victims = set(orchestrator.routers["talker"].requests_on(0))
            ray.kill(old_actor)
            return victims, await asyncio.wait_for(asyncio.gather(*tasks), 120)

    victims, results = asyncio.run(scenario())
    assert len(victims) == STREAMS // 2  # the router spread the streams over both talker replicas
    for request_id, events in results:
        last = events[-1]
        if request_id in victims:
            assert "'talker' replica 0" in last["error"]["message"] and "Ray actor died" in last["error"]["message"]
            print(f"{request_id}: {last['error']['message']}")
        else:
            assert "error" not in last and last["choices"][0]["finish_reason"] in ("stop", "length")
    # Restarted as a new actor, healthy again, and it serves: a lone request lands on replica 0.
    deadline = time.monotonic() + 60
    while not all(r.healthy for s in orchestrator.health().stages for r in s.replicas):
        assert time.monotonic() < deadline, orchestrator.health()
        time.sleep(0.2)
    assert link.handle.actor is not old_actor
    detail = next(r.detail for s in orchestrator.health().stages if s.stage == "talker" for r in s.replicas
                  if r.replica == 0)
    assert detail == "restarted 1 time(s)"
    text, pcm = _speak(on_ray.url)
    assert text and len(pcm) > FRAMES * 1920
