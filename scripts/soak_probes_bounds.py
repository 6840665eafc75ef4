"""Issue 51's responses, realtime and audio probes, for ``soak.py`` (registered in ``soak_probes.Probes.all``): each
is sent as an attacker would and must end as the hardened server answers it, while the canary watches the event
loop and the soak the memory.

- ``responses_metadata``: 1M metadata keys, and one 64 MB value: a 400 naming metadata, refused from the raw size.
- ``responses_unknown_field``: an input item with a 64 MB unknown field, stored: answered (the field is not kept).
- ``responses_other_key``: a response stored under one key is a 404 for another (read, continue, delete).
- ``realtime_flood``: 10,000 ``session.update`` back to back on an ephemeral key's session: every one answered,
  the flood past --realtime-events-per-second with rate_limit_exceeded errors.
- ``realtime_item_audio``: two items of 599 s of G.711 each: added, decoded off the event loop.
- ``realtime_memory``: 10 sessions buffering and committing 600 s turns together, then more sessions than
  --max-realtime-sessions: each event answered (done, or refused naming its bound), no socket dropped.
- ``nonfinite_audio``: a FLOAT WAV holding NaN to chat, responses, transcriptions and a voice upload: 400s.
- ``internal_text``: undecodable audio, a 1 MB model name, an unknown voice: 4xx naming no library, echoing
  nothing huge, listing no one's voices.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import io
import json
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

import httpx
import numpy as np
from soak_server import OTHER_KEY
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

if TYPE_CHECKING:
    from soak_probes import Probes

FLOOD_EVENTS = 10_000
MEMORY_SESSIONS = 10  # each holds up to 134 MB (600 s buffered, 1,200 s committed): more than 1 GiB together
MEMORY_TURNS = 3  # per session: 600 s buffered, committed (the 1,200 s each session keeps fill by the third)
SESSION_LIMIT = 64  # the server's --max-realtime-sessions (its default)
LIBRARY_WORDS = ("Errno", "Invalid data found", "Error opening", "Format not recognised", "object at 0x")
HUGE = "m" * 1_000_000


def nan_float_wav(seconds: float = 1.0, rate: int = 16_000) -> bytes:
    import soundfile as sf

    samples = (0.1 * np.sin(np.arange(int(seconds * rate)) / 10)).astype(np.float32)
    samples[-100] = np.nan
    out = io.BytesIO()
    sf.write(out, samples, rate, format="WAV", subtype="FLOAT")
    return out.getvalue()


class BoundsProbes:
    def __init__(self, probes: Probes) -> None:
        self.p = probes

    def all(self) -> list[tuple[str, Callable[[httpx.AsyncClient], Awaitable[None]]]]:
        return [("responses_metadata", self.responses_metadata),
                ("responses_unknown_field", self.responses_unknown_field),
                ("responses_other_key", self.responses_other_key), ("realtime_flood", self.realtime_flood),
                ("realtime_item_audio", self.realtime_item_audio), ("realtime_memory", self.realtime_memory),
                ("nonfinite_audio", self.nonfinite_audio), ("internal_text", self.internal_text)]

    def _ok(self, name: str, started: float, r: httpx.Response, ok: bool) -> None:
        clean = not any(word in r.text[:4000] for word in LIBRARY_WORDS)
        self.p.record(name, started, ok and clean and r.status_code < 500, f"{r.status_code} {r.text[:200]}")

    # ---- /v1/responses ------------------------------------------------------------------------------------

    def _body(self, head: str, middle: bytes, tail: str) -> bytes:
        """A large JSON body joined from its pieces (``json.dumps`` of 64 MB held the GIL, and the canary sharing
        this process, for a tenth of a second)."""
        return b'{"model": "%s", ' % self.p.model.encode() + head.encode() + middle + tail.encode()

    async def responses_metadata(self, client: httpx.AsyncClient) -> None:
        million = await asyncio.to_thread(lambda: b",".join(b'"k%d": ""' % i for i in range(1_000_000)))
        for middle in (million, b'"k": "' + b"v" * 64_000_000 + b'"'):
            started = time.monotonic()
            body = await asyncio.to_thread(self._body, '"input": "hi", "metadata": {', middle, "}}")
            r = await client.post("/v1/responses", content=body, headers={"content-type": "application/json"})
            self._ok("responses_metadata", started, r, r.status_code == 400 and '"metadata"' in r.text)

    async def responses_unknown_field(self, client: httpx.AsyncClient) -> None:
        started = time.monotonic()
        body = await asyncio.to_thread(self._body, '"max_output_tokens": 4, "input": [{"type": "message", "role": '
                                       '"user", "content": "hi", "x_unknown": "', b"u" * 64_000_000, '"}]}')
        r = await client.post("/v1/responses", content=body, headers={"content-type": "application/json"})
        self._ok("responses_unknown_field", started, r, r.status_code == 200)

    async def responses_other_key(self, client: httpx.AsyncClient) -> None:
        started = time.monotonic()
        made = await client.post("/v1/responses", json={"model": self.p.model, "input": "My secret is 42.",
                                                        "max_output_tokens": 4})
        if made.status_code != 200:
            return self._ok("responses_other_key", started, made, False)
        rid, other = made.json()["id"], {"Authorization": f"Bearer {OTHER_KEY}"}
        answers = [await client.get(f"/v1/responses/{rid}", headers=other),
                   await client.post("/v1/responses", headers=other, json={
                       "model": self.p.model, "input": "My secret?", "previous_response_id": rid}),
                   await client.delete(f"/v1/responses/{rid}", headers=other)]
        codes = [a.status_code for a in answers]
        if codes == [401, 401, 401]:  # a --url server without the second key: nothing to compare
            return self.p.record("responses_other_key", started, True, "skipped: the server takes one key")
        mine = await client.get(f"/v1/responses/{rid}")
        self.p.record("responses_other_key", started, codes == [404, 404, 404] and mine.status_code == 200,
                      f"other key {codes}, own key {mine.status_code}")

    # ---- realtime ------------------------------------------------------------------------------------------

    async def _session(self, headers: dict[str, str] | None = None) -> ClientConnection:
        return await connect(self.p._ws("/v1/realtime"), additional_headers=headers or self.p.headers, max_size=None)

    async def realtime_flood(self, client: httpx.AsyncClient) -> None:
        """An ephemeral key is enough to open the session that floods."""
        started = time.monotonic()
        minted = await client.post("/v1/realtime/client_secrets", json={"session": {"type": "realtime"}})
        if minted.status_code != 200:
            return self._ok("realtime_flood", started, minted, False)
        kinds: dict[str, int] = {}
        async with await self._session({"Authorization": f"Bearer {minted.json()['value']}"}) as ws:
            await ws.recv()  # session.created
            update = json.dumps({"type": "session.update", "session": {"instructions": "Be brief."}})
            for _ in range(FLOOD_EVENTS):
                await ws.send(update)
            while sum(kinds.values()) < FLOOD_EVENTS:
                event = json.loads(await asyncio.wait_for(ws.recv(), 60))
                kind = event["type"] if event["type"] != "error" else event["error"]["code"]
                kinds[kind] = kinds.get(kind, 0) + 1
        ok = set(kinds) <= {"session.updated", "rate_limit_exceeded"} and kinds.get("rate_limit_exceeded", 0) > 0
        self.p.record("realtime_flood", started, ok, str(kinds))

    async def realtime_item_audio(self, client: httpx.AsyncClient) -> None:
        started = time.monotonic()
        audio = base64.b64encode(b"\x7f" * 8000 * 599).decode()
        item = json.dumps({"type": "conversation.item.create", "item": {"type": "message", "role": "user",
                                                                        "content": [{"type": "input_audio",
                                                                                     "audio": audio}]}})
        errors, done = [], 0
        async with await self._session() as ws:
            await ws.recv()
            await ws.send(json.dumps({"type": "session.update", "session": {"type": "realtime", "audio": {
                "input": {"format": {"type": "audio/pcmu"}, "turn_detection": None}}}}))
            for _ in range(2):
                await ws.send(item)
            while done < 2 and not errors:
                event = json.loads(await asyncio.wait_for(ws.recv(), 120))
                done += event["type"] == "conversation.item.done"
                errors += [event["error"]] if event["type"] == "error" else []
        self.p.record("realtime_item_audio", started, done == 2 and not errors, f"{done} items, errors {errors}")

    async def realtime_memory(self, client: httpx.AsyncClient) -> None:
        """Sessions that together hold more than --max-realtime-bytes at once (each waits for the others with 1,200 s
        committed and 600 s buffered): the appends past it are refused naming the flag; then past the session limit."""
        started = time.monotonic()
        together = asyncio.Barrier(MEMORY_SESSIONS)
        outcomes = await asyncio.gather(*(self._fill_session(together) for _ in range(MEMORY_SESSIONS)),
                                        return_exceptions=True)
        failed = [repr(o) for o in outcomes if isinstance(o, BaseException)]
        codes = sorted({code for o in outcomes if isinstance(o, list) for code in o})
        allowed = {"realtime_memory_exceeded", "too_many_items", "input_audio_buffer_commit_empty"}
        self.p.record("realtime_memory", started, not failed and "realtime_memory_exceeded" in codes
                      and set(codes) <= allowed, f"errors {codes}, failed {failed[:2]}")
        await self._past_session_limit()

    async def _fill_session(self, together: asyncio.Barrier) -> list[str]:
        """Turns of 600 s (20 s pieces) committed without a response, the last held until every session holds its
        own; the codes of the errors met."""
        piece = json.dumps({"type": "input_audio_buffer.append",
                            "audio": base64.b64encode(b"\0\0" * 24_000 * 20).decode()})
        codes: list[str] = []
        async with await self._session() as ws:
            await ws.recv()
            await ws.send(json.dumps({"type": "session.update", "session": {"type": "realtime",
                                      "streaming_input": False, "audio": {"input": {"turn_detection": None}}}}))
            for turn in range(MEMORY_TURNS):
                for _ in range(30):
                    await ws.send(piece)
                if turn == MEMORY_TURNS - 1:  # every append acted on (events are in order), then all at once
                    await ws.send(json.dumps({"type": "conversation.item.retrieve", "item_id": "-",
                                              "event_id": "sync"}))
                    codes += await self._until(ws, "sync")
                    codes.remove("item_not_found")
                    await together.wait()
                await ws.send(json.dumps({"type": "input_audio_buffer.commit", "event_id": f"commit{turn}"}))
                codes += await self._until(ws, f"commit{turn}")
        return codes

    @staticmethod
    async def _until(ws: ClientConnection, event_id: str) -> list[str]:
        """The codes of the errors met until the event ``event_id`` is answered (committed, or an error for it)."""
        codes = []
        while True:
            event = json.loads(await asyncio.wait_for(ws.recv(), 120))
            if event["type"] == "input_audio_buffer.committed":
                return codes
            if event["type"] == "error":
                codes.append(event["error"]["code"])
                if event["error"].get("event_id") == event_id:
                    return codes

    async def _past_session_limit(self) -> None:
        started = time.monotonic()
        async with contextlib.AsyncExitStack() as stack:
            opened = [await stack.enter_async_context(await self._session()) for _ in range(SESSION_LIMIT)]
            for ws in opened:
                await ws.recv()  # session.created: each holds its place
            async with await self._session() as extra:
                first = json.loads(await asyncio.wait_for(extra.recv(), 30))
                with contextlib.suppress(ConnectionClosed):
                    await asyncio.wait_for(extra.recv(), 30)  # the server closes it: 1013, try again later
                closed = extra.close_code
        ok = first.get("type") == "error" and first["error"]["code"] == "session_limit_reached" and closed == 1013
        self.p.record("realtime_sessions", started, ok, str(first)[:200])

    # ---- audio and errors -----------------------------------------------------------------------------------

    async def nonfinite_audio(self, client: httpx.AsyncClient) -> None:
        wav = nan_float_wav()
        data = base64.b64encode(wav).decode()
        part = {"type": "input_audio", "input_audio": {"data": data, "format": "wav"}}
        sends = [("/v1/chat/completions", {"json": {"model": self.p.model, "messages": [
                     {"role": "user", "content": [part]}]}}),
                 ("/v1/responses", {"json": {"model": self.p.model, "input": [{"role": "user", "content": [part]}]}}),
                 ("/v1/audio/transcriptions", {"data": {"model": self.p.model},
                                               "files": {"file": ("a.wav", wav, "audio/wav")}})]
        if self.p.voices_url is not None:
            sends.append((f"{self.p.voices_url}/v1/audio/voices", {"json": {
                "name": f"nan{time.monotonic_ns()}", "audio": {"data": data, "format": "wav"}}}))
        for path, kwargs in sends:
            started = time.monotonic()
            r = await client.post(path, **kwargs)
            self._ok("nonfinite_audio", started, r, r.status_code == 400 and "non-finite" in r.text)

    async def internal_text(self, client: httpx.AsyncClient) -> None:
        started = time.monotonic()
        junk = b"\x00\x01 no audio at all " * 64
        r = await client.post("/v1/audio/transcriptions", data={"model": self.p.model},
                              files={"file": ("a.wav", junk, "audio/wav")})
        self._ok("internal_text", started, r, r.status_code == 400)
        started = time.monotonic()
        r = await client.post("/v1/chat/completions", json={"model": HUGE, "messages": [{"role": "user",
                                                                                       "content": "hi"}]})
        self._ok("internal_text", started, r, r.status_code == 404 and len(r.text) < 2000)
        if self.p.voices_url is not None:
            started = time.monotonic()
            model = (await client.get(f"{self.p.voices_url}/v1/models")).json()["data"][0]["id"]
            r = await client.post(f"{self.p.voices_url}/v1/audio/speech", json={"model": model, "input": "hi",
                                                                               "voice": "nobody-at-all"})
            self._ok("internal_text", started, r, r.status_code == 400 and "registered:" not in r.text)
