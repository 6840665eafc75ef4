"""A Ray node lost mid-stream, on two nodes in two network namespaces (``netns_ray.py``): the thinker on the head
node, both talker replicas and code2wav on the second node. Its raylet is SIGKILLed while four audio streams
play through the OpenAI server:

* exactly those four streams end, within seconds, with an OpenAI-shaped error event naming the stage, the replica
  and the lost node; text-only requests, which need only the head node's thinker, are served throughout;
* no node offers the lost replicas' placement, so they wait for one: ``/ready`` and ``/health`` say
  ``degraded``, and a request for audio gets 503 ``stage_unavailable`` with ``Retry-After`` at once;
* a spare node with room for one talker replica joins: one talker starts there, code2wav still waits;
* the node starts again in its namespace, gets the rest back, and the server speaks again;
* nothing is left on the head: no request state, shared-memory segment, KV block, admission ticket or actor.

A second test cuts the link instead (veth down): the far replicas are found by their silence, the head keeps
serving text, and all comes back with the link. Both print what they measure, and the first the bytes that crossed
between the nodes (the veth) per second of audio (issue 52's figure)."""

from __future__ import annotations

import asyncio
import base64
import importlib.util
import json
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from omnistage.entrypoints.openai.api_server import build_app
from omnistage.pipeline.async_omni import AsyncOmni
from omnistage.pipeline.runtime import PipelineOptions
from tests.entrypoints.server_thread import ServerThread
from tests.pipeline.netns_ray import NetnsRayCluster, netns_ray_cluster
from tests.pipeline.specs import RAY_LABEL, RAY_SLOT, two_node_dict, write_spec

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.netns,
              pytest.mark.skipif(importlib.util.find_spec("ray") is None,
                                 reason="ray is not installed (pip install 'omnistage[ray]')")]
FRAMES = 400  # talker frames per stream: long enough that all four are mid-way when the node goes
STREAMS = 4
SLOT, LABEL = RAY_SLOT, RAY_LABEL
TEXT_TOKENS = 400  # the text-only stream's tokens (all of them: it ignores EOS)
FAIL_WITHIN_S = 15.0  # from the kill to each stream's error event
STALL_S = 4.0  # --stage-stall-timeout: a replica cut off is found by its silence
PROBE_AFTER_S = 6.0
# A talker replica takes one slot (Ray counts a node's custom resources in whole units): two on the second node,
# one on the spare.
SECOND_NODE = ("--num-cpus", "1", "--resources", json.dumps({SLOT: 2}), "--labels", f"{LABEL}=vocoder")
SPARE_NODE = ("--num-cpus", "1", "--resources", json.dumps({SLOT: 1}), "--labels", f"{LABEL}=spare")


@dataclass
class _Served:
    url: str
    engine: AsyncOmni
    cluster: NetnsRayCluster


@pytest.fixture(scope="module")
def served(tiny_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[_Served]:
    with netns_ray_cluster() as cluster, pytest.MonkeyPatch.context() as env:
        for name, value in cluster.env.items():
            env.setenv(name, value)  # this driver joins as the nodes were started (no token)
        import ray

        cluster.start_head("--num-cpus", "1", "--labels", f"{LABEL}=head")
        cluster.start_node(*SECOND_NODE)
        # The node address as given: Ray reads its loopback-only mode once per process, and another test module
        # may have turned it on before this one.
        ray.init(address=cluster.address, _node_ip_address=cluster.head_ip, log_to_driver=False)
        spec = two_node_dict(FRAMES)
        spec["stages"][1]["placement"]["resources"] = {SLOT: 1}
        config = write_spec(tmp_path_factory.mktemp("stages"), spec)
        options = PipelineOptions(talker_min_new_tokens=FRAMES, threads_per_replica=1, backend="ray",
                                  stage_stall_timeout_s=STALL_S)
        engine = AsyncOmni(tiny_dir, config, options, "tiny")
        thread = ServerThread(build_app(engine))
        try:
            yield _Served(thread.start(), engine, cluster)
        finally:
            thread.stop()
            asyncio.run(engine.shutdown())
            ray.shutdown()


def _body(audio: bool, max_tokens: int = 24) -> dict:
    body: dict = {"model": "tiny", "messages": [{"role": "user", "content": "Tell me about the sea."}],
                  "max_tokens": max_tokens, "stream": True}
    if audio:
        body.update(modalities=["text", "audio"], audio={"voice": "Ethan", "format": "pcm16"})
    return body


@dataclass
class _Stream:
    request_id: str
    events: list[dict]
    pcm: bytes
    ended_at: float


async def _stream(client: httpx.AsyncClient, url: str, body: dict, first: asyncio.Event | None = None) -> _Stream:
    """One streamed chat completion: its events and audio; ``first`` is set at its first audio (or, for text
    only, its first text)."""
    events, pcm = [], b""
    wanted = "audio" if "audio" in body else "content"
    async with client.stream("POST", f"{url}/v1/chat/completions", json=body) as response:
        assert response.status_code == 200, await response.aread()
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            events.append(json.loads(line[6:]))
            delta = (events[-1].get("choices") or [{}])[0].get("delta") or {}
            if delta.get("audio"):
                pcm += base64.b64decode(delta["audio"].get("data") or "")
            if delta.get(wanted) and first is not None:
                first.set()
    return _Stream(events[0]["id"], events, pcm, time.monotonic())


def _speak(url: str) -> _Stream:
    async def one() -> _Stream:
        async with httpx.AsyncClient(timeout=120) as client:
            return await _stream(client, url, _body(audio=True))

    return asyncio.run(one())


@dataclass
class _Broken:
    at: float  # when the node was cut off
    audio: list[_Stream]
    text: _Stream  # a long text-only stream, playing when the node went
    slowest_text_s: float  # the slowest of the short text requests sent one after another meanwhile


def _break_mid_stream(served: _Served, cut: Callable[[], object]) -> _Broken:
    """Four audio streams and a long text-only one; once all play, ``cut`` cuts the second node off. Short text
    requests follow one another until the audio streams end (the head's orchestrator must never stall them)."""
    async def scenario() -> _Broken:
        firsts = [asyncio.Event() for _ in range(STREAMS + 1)]
        text_body = {**_body(audio=False, max_tokens=TEXT_TOKENS), "ignore_eos": True}
        async with httpx.AsyncClient(timeout=120) as client:
            audio = [asyncio.ensure_future(_stream(client, served.url, _body(audio=True), first))
                     for first in firsts[:STREAMS]]
            await asyncio.wait_for(asyncio.gather(*(first.wait() for first in firsts[:STREAMS])), 90)
            text = asyncio.ensure_future(_stream(client, served.url, text_body, firsts[-1]))
            await asyncio.wait_for(firsts[-1].wait(), 30)
            at = time.monotonic()
            cut()
            ended = asyncio.ensure_future(asyncio.wait_for(asyncio.gather(*audio), 60))
            slowest = await _probe_text(client, served.url, ended)
            return _Broken(at, await ended, await asyncio.wait_for(text, 60), slowest)

    return asyncio.run(scenario())


async def _probe_text(client: httpx.AsyncClient, url: str, until: asyncio.Future) -> float:
    """Short text requests one after another until ``until`` is done and PROBE_AFTER_S longer (the failed
    replicas are then being killed and started again), returning the slowest's time."""
    slowest, stop_at = 0.0, float("inf")
    while time.monotonic() < stop_at:
        if until.done() and stop_at == float("inf"):
            stop_at = time.monotonic() + PROBE_AFTER_S
        start = time.monotonic()
        reply = await client.post(f"{url}/v1/chat/completions", json={**_body(audio=False, max_tokens=4),
                                                                      "stream": False})
        assert reply.status_code == 200, reply.text
        slowest = max(slowest, time.monotonic() - start)
        await asyncio.sleep(0.1)
    return slowest


def _check_only_audio_failed(broken: _Broken, fail_within_s: float, causes: tuple[str, ...]) -> None:
    # The head's thinker never noticed: the text-only stream ends as asked, and short ones kept being answered.
    assert broken.text.events[-1]["choices"][0]["finish_reason"] == "length", broken.text.events[-1]
    assert broken.slowest_text_s < 3, broken.slowest_text_s
    print(f"the text-only stream ended {broken.text.ended_at - broken.at:.1f} s after the cut, complete; the "
          f"slowest short text reply meanwhile took {broken.slowest_text_s:.1f} s")
    for stream in broken.audio:
        last = stream.events[-1]
        assert "error" in last, last
        message = last["error"]["message"]
        assert "replica" in message and any(cause in message for cause in causes), message
        assert stream.ended_at - broken.at < fail_within_s, (stream.ended_at - broken.at, message)
        print(f"{stream.request_id} ended {stream.ended_at - broken.at:.1f} s after the cut: {message}")


def _wait(condition, what: str, timeout_s: float = 60.0) -> None:  # noqa: ANN001 - a predicate
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"not {what} after {timeout_s:.0f} s"
        time.sleep(0.2)


def _replica_actors(pids: set[int]) -> int:
    """Ray worker processes running a replica (Ray names them after the actor's class)."""
    return sum("ReplicaActor" in _title(pid) for pid in pids)


def _title(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    except OSError:
        return ""


def _check_degraded(url: str) -> None:
    """The lost stages have no replica: degraded, audio refused at once with Retry-After, text still served."""
    # Started again at once, but no node fits them: they wait, and say so (a first try may have gone to the lost
    # node before Ray's health checks counted it dead, and failed: the next one waits).
    _wait(lambda: _waiting(url) == {"talker", "code2wav"}, "waiting for a node", 45)
    ready, health = httpx.get(f"{url}/ready"), httpx.get(f"{url}/health")
    assert ready.status_code == 503 and ready.json()["status"] == "degraded"
    assert health.status_code == 200 and health.json()["status"] == "degraded", health.text
    start = time.monotonic()
    refused = httpx.post(f"{url}/v1/chat/completions", json={**_body(audio=True), "stream": False}, timeout=30)
    assert refused.status_code == 503 and time.monotonic() - start < 5
    assert int(refused.headers["Retry-After"]) >= 1
    error = refused.json()["error"]
    assert error["code"] == "stage_unavailable" and "talker" in error["message"] and "code2wav" in error["message"]
    text = httpx.post(f"{url}/v1/chat/completions", json={**_body(audio=False), "stream": False}, timeout=60)
    assert text.status_code == 200 and text.json()["choices"][0]["message"]["content"]


def _waiting(url: str) -> set[str]:
    """The stages none of whose replicas serve, all waiting for a node to be placed on."""
    stages = httpx.get(f"{url}/health").json()["stages"]
    return {s["stage"] for s in stages if not s["healthy"] and all(
        "waiting for a Ray node that fits its placement" in r["detail"] for r in s["replicas"])}


def _check_nothing_left(served: _Served) -> None:
    orchestrator = served.engine.pipeline.runtime.orchestrator

    def idle() -> bool:
        stats = served.engine.stats()
        return stats.shm_segments == 0 and all(r.kv_blocks_used == 0 and r.running == 0 and r.queue_depth == 0
                                               for r in stats.replicas)

    _wait(idle, "idle (KV blocks, queues, shared memory)", 15)
    assert orchestrator.flows.states == {} and not orchestrator.flows.waiting
    in_flight = [line for line in httpx.get(f"{served.url}/metrics").text.splitlines()
                 if line.startswith("omnistage_requests_in_flight{")]
    assert in_flight and all(float(line.rsplit(" ", 1)[1]) == 0 for line in in_flight), in_flight
    # Ray knows the live replicas' actors only (the lost node's were ended, not left pending or orphaned).
    import ray

    assert set(ray.util.list_named_actors()) == {link.handle.name for link in orchestrator.links.values()}
    # One replica actor per replica, on the node Ray placed it on: none left over from the lost node.
    placed = [_replica_actors(pids) for pids in (served.cluster.head_pids(), served.cluster.head_pids("spare"),
                                                 served.cluster.node_pids())]
    # The thinker on the head; the talker that went to the spare (the first test) stays there.
    assert placed == ([1, 1, 2] if served.cluster.spare is not None else [1, 0, 3]), placed


def _print_link_bytes(served: _Served) -> None:
    """Bytes between the nodes per second of audio: all of them (both ways on the veth: Ray's traffic, TCP's
    and ours), and the orchestrator's share by stage and direction (the client, on the head, gets the audio)."""
    before, sockets = served.cluster.link_bytes(), served.engine.stats().crossings()
    stream = _speak(served.url)
    seconds = len(stream.pcm) / 2 / 24000
    by_stage = {key: (n - sockets[key]) / seconds for key, n in served.engine.stats().crossings().items()}
    print(f"bytes between the nodes per audio second: {(served.cluster.link_bytes() - before) / seconds:,.0f} on "
          "the link; at the head's sockets: " + ", ".join(f"{stage} {way} {rate:,.0f}"
                                                          for (stage, way), rate in sorted(by_stage.items())))


def test_a_lost_node_fails_only_its_streams_degrades_and_comes_back(served: _Served) -> None:
    _print_link_bytes(served)
    _check_only_audio_failed(_break_mid_stream(served, served.cluster.kill_node_raylet), FAIL_WITHIN_S, ("node",))
    _check_degraded(served.url)
    _check_a_spare_takes_what_fits(served)
    rejoined_at = time.monotonic()
    served.cluster.start_node(*SECOND_NODE)
    _check_back(served, rejoined_at)


def _check_a_spare_takes_what_fits(served: _Served) -> None:
    """A spare node with room for one talker replica (and no vocoder label) joins: one waiting talker starts
    there; code2wav still has no node, so the server stays degraded."""
    joined_at = time.monotonic()
    served.cluster.start_spare(*SPARE_NODE)
    _wait(lambda: _talkers_serving(served) == 1, "a talker on the spare")
    print(f"a talker replica served from the spare {time.monotonic() - joined_at:.1f} s after it joined")
    assert _waiting(served.url) == {"code2wav"}
    assert httpx.get(f"{served.url}/ready").json()["status"] == "degraded"
    assert _replica_actors(served.cluster.head_pids("spare")) == 1


def _talkers_serving(served: _Served) -> int:
    return sum(r.healthy for s in served.engine.health().stages if s.stage == "talker" for r in s.replicas)


def _all_back(served: _Served) -> bool:
    return all(r.healthy for s in served.engine.health().stages for r in s.replicas)


def _check_back(served: _Served, since: float) -> None:
    """Every replica serves again, the server speaks, and nothing was left behind."""
    _wait(lambda: _all_back(served), "all back")
    print(f"every replica back {time.monotonic() - since:.1f} s after the node came back: "
          + ", ".join(f"{s.stage}[{r.replica}] {r.detail or 'never down'}"
                      for s in served.engine.health().stages for r in s.replicas))
    assert httpx.get(f"{served.url}/ready").json()["status"] == "ready"
    back = _speak(served.url)
    assert "error" not in back.events[-1] and len(back.pcm) > FRAMES * 1920
    _check_nothing_left(served)


def test_a_cut_link_fails_the_far_streams_without_stalling_the_head(served: _Served) -> None:
    """The link goes down instead: no socket closes, so the far replicas are found by their silence (the stall
    timeout), while the head's orchestrator keeps serving text; the link comes back and so do they (the node
    started again if Ray counted it dead meanwhile)."""
    broken = _break_mid_stream(served, lambda: served.cluster.set_link(False))
    try:
        # Found silent, or (where a far actor's death reached Ray first) unreachable on its node.
        _check_only_audio_failed(broken, STALL_S + FAIL_WITHIN_S, ("no heartbeat", "node"))
    finally:
        served.cluster.set_link(True)
    restored_at = time.monotonic()
    node = served.cluster.node
    _wait(lambda: _all_back(served) or (node is not None and node.process.poll() is not None), "back or gone")
    if not _all_back(served):
        served.cluster.start_node(*SECOND_NODE)
    _check_back(served, restored_at)
