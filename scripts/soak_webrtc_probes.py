"""Issue 51's WebRTC and ephemeral-key probes, for ``soak.py`` (registered in ``soak_probes.Probes.all``): offers
an attacker or a broken browser sends to ``POST /v1/realtime/calls``, each answered as the hardened server answers
it (a 4xx naming the bound or the field, never a 5xx nor aiortc's words), the loop never held by aiortc.

Each offer is a real aiortc peer's (made once, then reused), edited: its candidates multiplied or pointed at the
server's own networks, its lines cut. Calls that are set up are hung up at once (a never-connecting one is left
to the server's --webrtc-connect-timeout, on purpose, by ``webrtc_never_connects``).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import httpx

Record = Callable[[str, float, bool, str], None]
CALLS = "/v1/realtime/calls"
FLOOD = 400  # offers sent at once (the figure); past --webrtc-max-calls they must be 429s
INTERNALS = ("NoneType", "attribute", "Error", "object at 0x")  # aiortc's words a client must never read
PRIVATE = ["10.0.0.5", "192.168.1.20", "169.254.169.254", "fd00:ec2::254", "100.100.100.200"]


async def _offer() -> str:
    from aiortc import RTCConfiguration, RTCPeerConnection
    from aiortc.mediastreams import AudioStreamTrack

    pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
    pc.createDataChannel("oai-events")
    pc.addTrack(AudioStreamTrack())
    await pc.setLocalDescription(await pc.createOffer())
    sdp = pc.localDescription.sdp
    await pc.close()
    return sdp


def with_candidates(sdp: str, hosts: list[str]) -> str:
    """The offer with a host candidate per address added to its first media section."""
    lines = "".join(f"a=candidate:{i} 1 udp 2130706431 {host} {1024 + i % 60000} typ host\r\n"
                    for i, host in enumerate(hosts))
    return sdp.replace("a=mid:0\r\n", "a=mid:0\r\n" + lines, 1)


@dataclass
class WebRtcProbes:
    url: str
    api_key: str
    record: Record
    _sdp: str | None = field(default=None, repr=False)

    def all(self) -> list[tuple[str, Callable[[httpx.AsyncClient], Awaitable[None]]]]:
        return [("webrtc_candidates", self.candidates), ("webrtc_call_flood", self.call_flood),
                ("webrtc_deep_session", self.deep_session), ("webrtc_bad_offers", self.bad_offers),
                ("webrtc_never_connects", self.never_connects)]

    async def offer(self) -> str:
        if self._sdp is None:
            self._sdp = await _offer()
        return self._sdp

    def _auth(self, key: str | None = None) -> dict[str, str]:
        return {"Authorization": f"Bearer {key or self.api_key}"}

    async def _post(self, client: httpx.AsyncClient, sdp: str, key: str | None = None) -> httpx.Response:
        return await client.post(CALLS, content=sdp, timeout=120,
                                 headers={**self._auth(key), "Content-Type": "application/sdp"})

    async def _post_form(self, client: httpx.AsyncClient, session: str, key: str | None = None) -> httpx.Response:
        return await client.post(CALLS, timeout=120, headers=self._auth(key),
                                 files={"sdp": (None, await self.offer()), "session": (None, session)})

    async def _hang_up(self, client: httpx.AsyncClient, r: httpx.Response, key: str | None = None) -> int:
        if r.status_code != 201:
            return 0
        return (await client.delete(r.headers["location"], headers=self._auth(key), timeout=30)).status_code

    async def _mint(self, client: httpx.AsyncClient, **session: object) -> str:
        r = await client.post("/v1/realtime/client_secrets", headers=self._auth(), timeout=30,
                              json={"session": {"type": "realtime", **session}})
        r.raise_for_status()
        return r.json()["value"]

    @staticmethod
    def _refused(r: httpx.Response, status: int, names: str) -> bool:
        """``status``, in OpenAI's error shape, naming ``names``, without aiortc's words."""
        text = r.text[:2000]
        return r.status_code == status and '"error"' in text and names in text and not any(w in text for w in INTERNALS)

    async def candidates(self, client: httpx.AsyncClient) -> None:
        """Hole 1: 2,000 candidates (116 KB, 0.73 s of the loop before), 40,000 (2.3 MB: minutes) and 40 (under
        the size bound): each refused before aiortc reads it. Candidates at private and metadata addresses: the
        call is set up without them (the server must not probe its own networks)."""
        started = time.monotonic()
        base = await self.offer()
        many = await self._post(client, with_candidates(base, [f"10.{i // 65536}.{i // 256 % 256}.{i % 256}"
                                                               for i in range(2000)]))
        huge = await self._post(client, with_candidates(base, [f"203.0.{i // 256 % 256}.{i % 256}"
                                                               for i in range(40_000)]))
        forty = await self._post(client, with_candidates(base, [f"203.0.113.{i}" for i in range(40)]))
        private = await self._post(client, with_candidates(base, PRIVATE))
        hung_up = await self._hang_up(client, private)
        ok = (self._refused(many, 400, "--webrtc-max-sdp-bytes") and huge.status_code == 413
              and self._refused(forty, 400, "--webrtc-max-candidates") and private.status_code == 201
              and hung_up == 200)
        self.record("webrtc_candidates", started, ok, f"{many.status_code} {huge.status_code} {forty.status_code} "
                                                      f"{private.status_code}/{hung_up} {forty.text[:160]}")

    async def call_flood(self, client: httpx.AsyncClient) -> None:
        """Hole 6: 400 offers at once: no more calls in progress than --webrtc-max-calls, the rest 429, every call
        hung up or already ended."""
        started = time.monotonic()
        sdp = await self.offer()
        answers = await asyncio.gather(*(self._post(client, sdp) for _ in range(FLOOD)), return_exceptions=True)
        statuses = [r.status_code if isinstance(r, httpx.Response) else type(r).__name__ for r in answers]
        made = [r for r in answers if isinstance(r, httpx.Response) and r.status_code == 201]
        hung_up = await asyncio.gather(*(self._hang_up(client, r) for r in made))
        refused = next((r for r in answers if isinstance(r, httpx.Response) and r.status_code == 429), None)
        # "64 calls are in progress (--webrtc-max-calls)": the server's bound, whatever it was started with
        limit = int(refused.json()["error"]["message"].split()[0]) if refused is not None else FLOOD
        # The bound holds calls in progress: a call set up early whose connect failed (the offer's peer is gone)
        # ends and frees its slot while the flood is still being answered (seconds on a busy host), so more than
        # `limit` may be set up in all; no more than `limit` may be alive at once, and those end by the hang-up
        # (200), the others having ended already (404).
        alive = hung_up.count(200)
        ok = (set(statuses) <= {201, 429} and 0 < alive <= limit and set(hung_up) <= {200, 404}
              and 429 in statuses)  # the flood meets the bound
        self.record("webrtc_call_flood", started, ok, f"{len(made)} calls (limit {limit}, {alive} alive at the end), "
                                                      f"{statuses.count(429)} refused, others {set(statuses) - {201, 429}}")

    async def deep_session(self, client: httpx.AsyncClient) -> None:
        """Holes 7 and 10: a session part 100,000 deep (a RecursionError and a 500 before, the key spent) is a
        400; the key then opens its call, and hangs it up itself."""
        started = time.monotonic()
        key = await self._mint(client, instructions="From the key.")
        deep = await self._post_form(client, '{"instructions": ' + "[" * 100_000 + "]" * 100_000 + "}", key)
        opened = await self._post(client, await self.offer(), key)
        hung_up = await self._hang_up(client, opened, key)
        ok = self._refused(deep, 400, "session") and opened.status_code == 201 and hung_up == 200
        self.record("webrtc_deep_session", started, ok, f"{deep.status_code} {deep.text[:160]}; key then "
                                                        f"{opened.status_code}, its hang-up {hung_up}")

    async def bad_offers(self, client: httpx.AsyncClient) -> None:
        """Holes 9 and 10: offers aiortc chokes on are 400s without its words; a wrong content type, a bad voice
        and a widened setting are 400s that leave the key usable."""
        started = time.monotonic()
        base = await self.offer()
        broken = [await self._post(client, base.replace("a=mid:0\r\n", "", 1)),
                  await self._post(client, "v=0\r\nm=audio 9 UDP/TLS/RTP/SAVPF 111\r\nc=IN\r\n")]
        key = await self._mint(client, instructions="From the key.")
        wrong_type = await client.post(CALLS, content=base, headers={**self._auth(key), "Content-Type": "text/plain"})
        voice = await self._post_form(client, json.dumps({"audio": {"output": {"voice": "nobody"}}}), key)
        wider = await self._post_form(client, json.dumps({"instructions": "Ignore the key."}), key)
        opened = await self._post(client, base, key)
        hung_up = await self._hang_up(client, opened, key)
        ok = (all(self._refused(r, 400, "sdp") for r in broken) and self._refused(wrong_type, 400, "application/sdp")
              and self._refused(voice, 400, "session.audio.output.voice")
              and self._refused(wider, 400, "session.instructions") and hung_up == 200)
        self.record("webrtc_bad_offers", started, ok, " ".join(f"{r.status_code}" for r in
                                                               (*broken, wrong_type, voice, wider, opened))
                    + f" hang-up {hung_up}; {broken[0].text[:160]}")

    async def never_connects(self, client: httpx.AsyncClient) -> None:
        """A call whose peer never connects is ended, and its place freed, after --webrtc-connect-timeout (10 s
        by default) rather than the 300 s idle timeout: its hang-up then finds no call."""
        started = time.monotonic()
        r = await self._post(client, await self.offer())
        await asyncio.sleep(15.0)
        gone = (await client.delete(r.headers["location"], headers=self._auth(), timeout=30)).status_code \
            if r.status_code == 201 else 0
        self.record("webrtc_never_connects", started, r.status_code == 201 and gone == 404,
                    f"{r.status_code}, hang-up after 15 s: {gone}")
