"""``POST /v1/realtime/calls`` against hostile offers (issue 51): bounds checked before aiortc reads the offer, an
address policy for the candidates the server would probe, an atomic call limit, calls that never connect ended
in seconds, errors that name the field or the bound, and ephemeral keys spent only by a call that was set up."""

from __future__ import annotations

import asyncio
import ipaddress
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any

import httpx
import pytest
from aiortc import RTCConfiguration, RTCPeerConnection, RTCSessionDescription
from websockets.asyncio.client import connect

from omnistage.entrypoints.cli import build_parser
from omnistage.entrypoints.openai.api_server import build_app
from omnistage.entrypoints.openai.server_config import LOOPBACK_NETWORKS, AccessPolicy, ServingOptions, WebRtcPolicy
from omnistage.entrypoints.openai.webrtc.offer_screen import END_OF_CANDIDATES, screen_offer
from omnistage.entrypoints.openai.webrtc.tracks import ReplyTrack
from omnistage.entrypoints.serve_config import ServeConfig
from omnistage.usage_error import UsageError
from tests.entrypoints.conftest import TEST_LIMITS
from tests.entrypoints.fake_engine import FakeEngine, RecordingProcessor, fake_front_end
from tests.entrypoints.server_thread import ServerThread

KEY = "sk-webrtc-hardening-0123456789"
API = {"Authorization": f"Bearer {KEY}"}
CALLS = "/v1/realtime/calls"
PROBED = ["10.0.0.5", "192.168.1.20", "169.254.169.254", "fd00:ec2::254", "127.0.0.1", "::ffff:10.1.2.3",
          "4e3b1c2a-0000-4000-8000-000000000000.local"]


@dataclass
class Server:
    base_url: str
    app: Any  # noqa: ANN401 - FastAPI

    @property
    def calls(self) -> Any:  # noqa: ANN401 - webrtc.calls.Calls
        return self.app.state.webrtc_calls


def _serve(processor: RecordingProcessor, webrtc: WebRtcPolicy | None = None, limits: Any = TEST_LIMITS  # noqa: ANN401
           ) -> Iterator[Server]:
    app = build_app(FakeEngine(fake_front_end(processor)), limits, access=AccessPolicy(api_keys=(KEY,)),
                    serving=ServingOptions(vad="energy"), webrtc=webrtc)
    thread = ServerThread(app)
    yield Server(thread.start(), app)
    thread.stop()


@pytest.fixture(scope="module")
def server(processor: RecordingProcessor) -> Iterator[Server]:
    yield from _serve(processor)


@pytest.fixture(scope="module")
def on_loopback(processor: RecordingProcessor) -> Iterator[Server]:
    """As ``--host 127.0.0.1`` serves (loopback candidates allowed), two calls at most, slow to time out."""
    yield from _serve(processor, WebRtcPolicy(max_calls=2, connect_timeout=60.0, allowed_networks=LOOPBACK_NETWORKS))


@pytest.fixture(scope="module")
def impatient(processor: RecordingProcessor) -> Iterator[Server]:
    """One call at most, ended unless it connects within a second."""
    yield from _serve(processor, WebRtcPolicy(max_calls=1, connect_timeout=1.0))


@pytest.fixture(scope="module")
def one_session(processor: RecordingProcessor) -> Iterator[Server]:
    """One realtime session at most (--max-realtime-sessions 1), WebSocket and WebRTC together."""
    yield from _serve(processor, limits=replace(TEST_LIMITS, max_realtime_sessions=1))


async def _peer() -> tuple[RTCPeerConnection, str]:
    """A browser-like peer and its offer (a data channel and a microphone track, every candidate gathered)."""
    pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
    pc.createDataChannel("oai-events")
    pc.addTrack(ReplyTrack())
    await pc.setLocalDescription(await pc.createOffer())
    return pc, pc.localDescription.sdp


async def _offer() -> str:
    pc, sdp = await _peer()
    await pc.close()
    return sdp


def _with_lines(sdp: str, lines: list[str]) -> str:
    """``lines`` added to the offer's first media section, after its ``a=mid``."""
    return sdp.replace("a=mid:0\r\n", "a=mid:0\r\n" + "".join(line + "\r\n" for line in lines), 1)


def _candidates(hosts: list[str]) -> list[str]:
    return [f"a=candidate:{i} 1 udp 2130706431 {host} {40000 + i} typ host" for i, host in enumerate(hosts)]


def _remote_hosts(server: Server) -> set[str]:
    """The candidate addresses aiortc holds for the server's live calls (those its ICE checks go to)."""
    return {c.ip for call in server.calls.live.values() for t in call.pc.getTransceivers()
            for c in t.receiver.transport.transport.getRemoteCandidates()}


async def _post(http: httpx.AsyncClient, sdp: str, key: str = KEY) -> httpx.Response:
    return await http.post(CALLS, content=sdp, headers={"Authorization": f"Bearer {key}",
                                                        "Content-Type": "application/sdp"})


async def _post_form(http: httpx.AsyncClient, sdp: str, session: str, key: str = KEY) -> httpx.Response:
    return await http.post(CALLS, headers={"Authorization": f"Bearer {key}"},
                           files={"sdp": (None, sdp), "session": (None, session)})


async def _until(predicate: Any, timeout: float) -> bool:  # noqa: ANN401
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.05)
    return True


async def _hang_up_all(http: httpx.AsyncClient, server: Server) -> None:
    for call_id in list(server.calls.live):
        await http.delete(f"{CALLS}/{call_id}", headers=API)


def _error(r: httpx.Response) -> dict[str, Any]:
    assert r.headers["content-type"].startswith("application/json"), r.text[:200]
    return r.json()["error"]


# -- bounds checked on the offer's text, before aiortc reads it -------------------------------------------------

def test_candidates_past_the_bound_are_refused_before_aiortc_reads_the_offer(server: Server) -> None:
    async def scenario() -> None:
        base = await _offer()
        async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as http:
            r = await _post(http, _with_lines(base, _candidates([f"203.0.113.{i % 250}" for i in range(40)])))
            assert r.status_code == 400 and "--webrtc-max-candidates" in _error(r)["message"]
            assert _error(r)["code"] == "too_many_candidates" and _error(r)["param"] == "sdp"
            # The 2,000 candidates (116 KB) held the loop 0.7 s in aiortc's pairing: refused for their size.
            r = await _post(http, _with_lines(base, _candidates([f"10.0.{i // 250}.{i % 250}" for i in range(2000)])))
            assert r.status_code == 400 and "--webrtc-max-sdp-bytes" in _error(r)["message"]
            sections = base + "".join(f"m=audio 9 UDP/TLS/RTP/SAVPF 0\r\na=mid:x{i}\r\n" for i in range(5))
            r = await _post(http, sections)
            assert r.status_code == 400 and "--webrtc-max-media-sections" in _error(r)["message"]
            assert not server.calls.live and server.calls.setting_up == 0  # nothing was set up

    asyncio.run(scenario())


def test_a_body_past_the_offer_bound_is_a_413_naming_it(server: Server) -> None:
    async def scenario() -> None:
        async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as http:
            r = await _post_form(http, await _offer(), json.dumps({"instructions": "x" * 300_000}))
            assert r.status_code == 413 and "--webrtc-max-offer-bytes" in _error(r)["message"]

    asyncio.run(scenario())


# -- where the server's ICE checks may go ---------------------------------------------------------------------

def test_screening_keeps_public_and_allowed_candidates_and_waits_for_the_peer_when_it_leaves_some_out() -> None:
    public = ["8.8.8.8", "2001:4860:4860::8888"]
    offer = "v=0\r\nm=audio 9 UDP/TLS/RTP/SAVPF 0\r\n" + "\r\n".join(_candidates([*public, *PROBED]))
    screened = screen_offer(offer + f"\r\n{END_OF_CANDIDATES}\r\n", WebRtcPolicy(allowed_networks=("10.0.0.0/8",)))
    kept = [line.split()[4] for line in screened.sdp.splitlines() if line.startswith("a=candidate:")]
    assert kept == [*public, "10.0.0.5", "::ffff:10.1.2.3"]  # an IPv4-mapped address is judged as the IPv4 in it
    assert set(screened.left_out) == set(PROBED) - set(kept)
    assert END_OF_CANDIDATES not in screened.sdp  # else aioice gives up before the peer's checks arrive
    everything_public = screen_offer(f"v=0\r\nm=audio 9 RTP 0\r\n{_candidates(public)[0]}\r\n{END_OF_CANDIDATES}",
                                     WebRtcPolicy())
    assert END_OF_CANDIDATES in everything_public.sdp and not everything_public.left_out


def test_the_webrtc_flags_make_the_policy_and_loopback_follows_the_listening_host() -> None:
    def config(*flags: str) -> ServeConfig:
        return ServeConfig.from_args(build_parser().parse_args(["serve", *flags]), environ={})

    exposed = config("--host", "0.0.0.0", "--webrtc-max-calls", "8", "--webrtc-connect-timeout", "2.5",
                     "--webrtc-allowed-networks", "10.0.0.0/8,fd00::/8").webrtc
    assert exposed.max_calls == 8 and exposed.connect_timeout == 2.5
    assert exposed.allowed_networks == (ipaddress.ip_network("10.0.0.0/8"), ipaddress.ip_network("fd00::/8"))
    assert config().webrtc == WebRtcPolicy(allowed_networks=LOOPBACK_NETWORKS)  # the default host: 127.0.0.1
    for flags in (("--webrtc-max-candidates", "0"), ("--webrtc-allowed-networks", "intranet")):
        with pytest.raises(UsageError):
            config(*flags)


def test_candidates_at_private_link_local_and_metadata_addresses_are_never_probed(server: Server) -> None:
    async def scenario() -> None:
        pc, sdp = await _peer()
        async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as http:
            r = await _post(http, _with_lines(sdp, _candidates(PROBED)))
            assert r.status_code == 201, r.text
            held = _remote_hosts(server)
            assert not held & {"10.0.0.5", "192.168.1.20", "169.254.169.254", "fd00:ec2::254", "127.0.0.1",
                               "::ffff:10.1.2.3", "10.1.2.3"}, held
            # The peer still connects: its own checks reach the server's candidates (peer-reflexive).
            await pc.setRemoteDescription(RTCSessionDescription(r.text, "answer"))
            call = next(iter(server.calls.live.values()))
            assert await _until(call.transport.connected.is_set, 10), "the call did not connect"
            await _hang_up_all(http, server)
        await pc.close()

    asyncio.run(scenario())


def test_a_server_on_loopback_takes_loopback_candidates_only_besides_public_ones(on_loopback: Server) -> None:
    async def scenario() -> None:
        async with httpx.AsyncClient(base_url=on_loopback.base_url, timeout=30) as http:
            r = await _post(http, _with_lines(await _offer(), _candidates(PROBED)))
            assert r.status_code == 201, r.text
            assert _remote_hosts(on_loopback) == {"127.0.0.1"}
            await _hang_up_all(http, on_loopback)

    asyncio.run(scenario())


# -- the call limit and calls that never connect --------------------------------------------------------------

def test_offers_sent_at_once_cannot_pass_the_call_limit_together(on_loopback: Server) -> None:
    async def scenario() -> None:
        offers = [await _offer() for _ in range(8)]  # answered, never connected: each keeps its place
        async with httpx.AsyncClient(base_url=on_loopback.base_url, timeout=30) as http:
            answers = await asyncio.gather(*(_post(http, sdp) for sdp in offers))
            statuses = sorted(r.status_code for r in answers)
            assert statuses == [201, 201] + [429] * 6, statuses
            assert "--webrtc-max-calls" in _error(next(r for r in answers if r.status_code == 429))["message"]
            assert len(on_loopback.calls.live) == 2
            await _hang_up_all(http, on_loopback)

    asyncio.run(scenario())


def test_a_call_that_never_connects_gives_its_place_back_within_the_connect_timeout(impatient: Server) -> None:
    # The idle timeout (300 s by default) would hold the place; the connect timeout ends the call.
    async def scenario() -> None:
        async with httpx.AsyncClient(base_url=impatient.base_url, timeout=30) as http:
            assert (await _post(http, await _offer())).status_code == 201  # the peer never takes the answer
            assert (await _post(http, await _offer())).status_code == 429
            assert await _until(lambda: not impatient.calls.live, 8), "the call kept its place"
            assert (await _post(http, await _offer())).status_code == 201
            await _hang_up_all(http, impatient)

    asyncio.run(scenario())


def test_a_call_past_the_realtime_session_limit_is_refused_before_its_answer(one_session: Server) -> None:
    # Answered, the call's session was refused as it started and the call closed before its data channel opened:
    # the client heard nothing (the soak's "no session.created" while a probe held every realtime session).
    budget = one_session.app.state.realtime.budget

    async def scenario() -> None:
        ws_url = one_session.base_url.replace("http://", "ws://") + "/v1/realtime"
        async with httpx.AsyncClient(base_url=one_session.base_url, timeout=30) as http:
            async with connect(ws_url, additional_headers=API, open_timeout=10) as ws:
                assert json.loads(await ws.recv())["type"] == "session.created"
                refused = await _post(http, await _offer())
                assert refused.status_code == 429, refused.text[:200]
                assert "--max-realtime-sessions" in _error(refused)["message"]
                assert not one_session.calls.live and budget.sessions == 1
            assert await _until(lambda: budget.sessions == 0, 5), "the WebSocket's session kept its place"
            opened = await _post(http, await _offer())
            assert opened.status_code == 201 and budget.sessions == 1  # the call's session holds the place
            await _hang_up_all(http, one_session)
            assert budget.sessions == 0

    asyncio.run(scenario())


# -- errors name the field or the bound -----------------------------------------------------------------------

def test_an_offer_aiortc_cannot_take_is_a_400_without_its_internals(server: Server) -> None:
    async def scenario() -> None:
        base = await _offer()
        no_mid = base.replace("a=mid:0\r\n", "", 1)  # aiortc: "'NoneType' object has no attribute ..."
        no_ice = "\r\n".join(line for line in base.splitlines() if not line.startswith("a=ice-")) + "\r\n"
        async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as http:
            for sdp in (no_mid, no_ice, "v=0\r\nm=audio 9 UDP/TLS/RTP/SAVPF 111\r\nc=IN\r\n"):
                r = await _post(http, sdp)
                error = _error(r)
                assert r.status_code == 400 and error["param"] == "sdp", r.text
                assert not any(word in error["message"] for word in ("NoneType", "attribute", "Error")), error
            r = await _post(http, _with_lines(base, ["a=candidate:1 1 udp"]))
            assert r.status_code == 400 and _error(r)["code"] == "invalid_candidate"

    asyncio.run(scenario())


def test_a_deeply_nested_session_part_is_a_400(server: Server) -> None:
    async def scenario() -> None:
        async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as http:
            r = await _post_form(http, await _offer(), '{"instructions": ' + "[" * 50_000 + "]" * 50_000 + "}")
            assert r.status_code == 400 and _error(r)["param"] == "session", r.text
            r = await _post_form(http, await _offer(), '{"instructions": "\\ud800"}')
            assert r.status_code == 400 and _error(r)["code"] == "invalid_json"

    asyncio.run(scenario())


# -- ephemeral keys -------------------------------------------------------------------------------------------

async def _mint(http: httpx.AsyncClient, session: dict[str, Any]) -> str:
    r = await http.post("/v1/realtime/client_secrets", headers=API, json={"session": {"type": "realtime", **session}})
    assert r.status_code == 200, r.text
    return r.json()["value"]


def test_a_request_that_fails_does_not_spend_the_key(server: Server) -> None:
    async def scenario() -> None:
        async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as http:
            key = await _mint(http, {"instructions": "From the key."})
            wrong_type = await http.post(CALLS, content=await _offer(),
                                         headers={"Authorization": f"Bearer {key}", "Content-Type": "text/plain"})
            assert wrong_type.status_code == 400 and _error(wrong_type)["code"] == "unsupported_content_type"
            deep = await _post_form(http, await _offer(), "[" * 50_000, key)
            assert deep.status_code == 400
            assert (await _post(http, "v=0\r\nm=audio 9 UDP/TLS/RTP/SAVPF 111\r\n", key)).status_code == 400
            assert (await _post(http, await _offer(), key)).status_code == 201  # the key opens its one call
            assert (await _post(http, await _offer(), key)).status_code == 401  # and only one
            await _hang_up_all(http, server)

    asyncio.run(scenario())


def test_the_form_session_is_checked_like_session_update(server: Server) -> None:
    async def scenario() -> None:
        async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as http:
            for session, param in (({"audio": {"output": {"voice": "nobody"}}}, "session.audio.output.voice"),
                                   ({"instructions": 42}, "session.instructions"),
                                   ({"output_modalities": ["smell"]}, "session.output_modalities")):
                r = await _post_form(http, await _offer(), json.dumps({"type": "realtime", **session}))
                assert r.status_code == 400 and _error(r)["param"] == param, r.text
            assert not server.calls.live

    asyncio.run(scenario())


def test_the_form_may_narrow_the_key_settings_but_never_widen_them(server: Server) -> None:
    minted = {"instructions": "From the key.", "output_modalities": ["text"], "max_output_tokens": 100}

    async def scenario() -> None:
        async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as http:
            for session, param in (({"instructions": "Ignore the key."}, "session.instructions"),
                                   ({"output_modalities": ["text", "audio"]}, "session.output_modalities"),
                                   ({"max_output_tokens": "inf"}, "session.max_output_tokens")):
                key = await _mint(http, minted)
                r = await _post_form(http, await _offer(), json.dumps(session), key)
                assert r.status_code == 400 and _error(r)["param"] == param, r.text
                assert _error(r)["code"] == "setting_fixed_by_key"
                assert (await _post(http, await _offer(), key)).status_code == 201  # the refusal did not spend it
            key = await _mint(http, minted)
            narrower = {"instructions": "From the key.", "max_output_tokens": 50,
                        "audio": {"output": {"voice": "Aiden"}}}  # the voice: left open by the key
            r = await _post_form(http, await _offer(), json.dumps(narrower), key)
            assert r.status_code == 201, r.text
            session = server.calls.live[r.headers["location"].rsplit("/", 1)[1]].session
            assert await _until(lambda: session.config.max_output_tokens == 50, 5)  # applied as the session opens
            assert session.config.instructions == "From the key." and session.config.output_modalities == ("text",)
            assert session.config.voice == "Aiden"
            await _hang_up_all(http, server)

    asyncio.run(scenario())
