"""Soak: a bounded mixed load against an omnistage server, checking for error responses and flat memory.

    .venv/bin/python scripts/soak.py --minutes 10                 # starts `omnistage serve --model tiny` itself
    .venv/bin/python scripts/soak.py --url http://127.0.0.1:8000 --server-pid PID --minutes 10
      (that server started with --api-key soak-key --send-timeout 5 --header-timeout 5)

The mix, per client loop: whole text chats, streamed text+speech chats, /v1/audio/speech, streams the client
leaves early (disconnects), and hostile cases: bad bodies (sampling extremes, odd sample rates, pixel bombs,
bad paths: must be 4xx), a 16 MB body of a million empty messages (400), requests without the API key (401),
streams whose client never reads (the server must cut them after --send-timeout) and slowloris headers (cut
after --header-timeout). Any 5xx, any unexpected status or a stream without its end counts as an error.
Memory is the summed RSS of the server and its stage processes, sampled every few seconds; "flat" compares the
mean of the last quarter of the run with the first quarter after warm-up.
At the end /metrics must show no KV blocks, queued/running requests or shared-memory segments left.
Exit status 0 only when there were no errors, memory grew less than --max-growth-mib, and nothing leaked.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import random
import signal
import socket
import struct
import subprocess
import sys
import time
import zlib
from collections import Counter
from pathlib import Path

import httpx

API_KEY = "soak-key"
SEND_TIMEOUT_S = 5.0  # the server this script starts uses these; a --url server should too
HEADER_TIMEOUT_S = 5.0


def _wav(rate: int, frames: int) -> str:
    data = b"\0\0" * frames
    fmt = struct.pack("<HHIIHH", 1, 1, rate, (rate * 2) % 2**32, 2, 16)
    return base64.b64encode(b"RIFF" + struct.pack("<I", 36 + len(data)) + b"WAVEfmt " + struct.pack("<I", 16) + fmt
                            + b"data" + struct.pack("<I", len(data)) + data).decode()


def _png_claiming(width: int, height: int) -> str:
    ihdr = b"IHDR" + struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    png = b"\x89PNG\r\n\x1a\n" + struct.pack(">I", 13) + ihdr + struct.pack(">I", zlib.crc32(ihdr))
    return "data:image/png;base64," + base64.b64encode(png).decode()


def _parts(*parts: dict[str, object]) -> list[dict[str, object]]:
    return [{"role": "user", "content": [{"type": "text", "text": "hi"}, *parts]}]

HOSTILE = [
    {"messages": "hi"},
    {"max_tokens": "many"},
    {"messages": [{"role": "user", "content": [
        {"type": "input_audio", "input_audio": {"data": "////", "format": "wav"}}]}]},
    {"messages": [{"role": "user", "content": [{"type": "audio_url", "audio_url": {"url": "file:///etc/passwd"}}]}]},
    {"n": 1000},  # unknown top-level fields are accepted (as OpenAI does); out-of-range ones are not
    {"stream_options": {"frobnicate": 1}},
    {"repetition_penalty": 1e300},
    {"seed": -1},
    {"seed": 2**64},
    {"top_k": 1e23},
    {"messages": _parts({"type": "input_audio", "input_audio": {"data": _wav(2_147_483_629, 100), "format": "wav"}})},
    {"messages": _parts({"type": "input_audio", "input_audio": {"data": _wav(2_999_999, 3000), "format": "wav"}})},
    {"messages": _parts(*[{"type": "image_url", "image_url": {"url": _png_claiming(4096, 4096)}}] * 8)},
    {"messages": _parts({"type": "image_url", "image_url": {"url": _png_claiming(100_000, 100_000)}})},
    {"messages": _parts({"type": "audio_url", "audio_url": {"url": "file:///etc/passwd%00.wav"}})},
    {"messages": _parts({"type": "image_url", "image_url": {"url": "http://169.254.169.254/latest"}})},
]
MILLION_EMPTY = json.dumps({"model": "tiny", "messages": [{"role": "user"}] * 1_000_000}).encode()


def _rss_kib(pid: int) -> int:
    """RSS of ``pid`` and all its descendants, from /proc."""
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        try:
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
            for task in Path(f"/proc/{p}/task").iterdir():
                todo += [int(c) for c in (task / "children").read_text().split()]
        except (FileNotFoundError, ProcessLookupError):
            continue
    return total


class Soak:
    def __init__(self, url: str, model: str, seed: int) -> None:
        self.url = url
        self.host, self.port = url.removeprefix("http://").rsplit(":", 1)
        self.model = model
        self.rng = random.Random(seed)
        self.counts: Counter[str] = Counter()
        self.errors: list[str] = []
        self.latencies: dict[str, list[float]] = {}

    def _record(self, kind: str, started: float, ok: bool, detail: str = "") -> None:
        self.counts[kind] += 1
        self.latencies.setdefault(kind, []).append(time.monotonic() - started)
        if not ok:
            self.counts["errors"] += 1
            if len(self.errors) < 20:
                self.errors.append(f"{kind}: {detail[:300]}")

    def _chat(self, **extra: object) -> dict[str, object]:
        return {"model": self.model, "messages": [{"role": "user", "content": f"soak {self.rng.random():.6f}"}],
                "max_tokens": self.rng.randint(4, 24), "seed": self.rng.randint(0, 10**6), **extra}

    async def whole_chat(self, client: httpx.AsyncClient) -> None:
        started = time.monotonic()
        r = await client.post("/v1/chat/completions", json=self._chat())
        self._record("chat", started, r.status_code == 200 and bool(r.json()["choices"]), r.text)

    async def streamed_speech_chat(self, client: httpx.AsyncClient, leave_after: int | None = None) -> None:
        started = time.monotonic()
        kind = "stream" if leave_after is None else "disconnect"
        body = self._chat(stream=True, modalities=["text", "audio"], audio={"voice": "Ethan", "format": "pcm16"})
        done = False
        async with client.stream("POST", "/v1/chat/completions", json=body) as r:
            if r.status_code != 200:
                return self._record(kind, started, False, f"{r.status_code} {(await r.aread())[:200]!r}")
            events = 0
            async for line in r.aiter_lines():
                if not line.startswith("data: "):
                    continue
                events += 1
                if line == "data: [DONE]":
                    done = True
                elif "\"error\"" in line:
                    return self._record(kind, started, False, line)
                if leave_after is not None and events >= leave_after:
                    break  # closing the response here is the client disconnect
        self._record(kind, started, done or leave_after is not None, "stream ended without [DONE]")

    async def speech(self, client: httpx.AsyncClient) -> None:
        started = time.monotonic()
        r = await client.post("/v1/audio/speech", json={"model": self.model, "input": "soak test", "voice": "Ethan",
                                                         "response_format": "wav"})
        self._record("speech", started, r.status_code == 200 and r.content[:4] == b"RIFF", r.text[:200])

    async def hostile(self, client: httpx.AsyncClient) -> None:
        started = time.monotonic()
        body = {"model": self.model, "messages": [{"role": "user", "content": "hi"}], **self.rng.choice(HOSTILE)}
        r = await client.post("/v1/chat/completions", json=body)
        ok = 400 <= r.status_code < 500 and "error" in r.json()
        self._record("hostile", started, ok, f"{r.status_code} {r.text}")

    async def million_messages(self, client: httpx.AsyncClient) -> None:
        started = time.monotonic()
        r = await client.post("/v1/chat/completions", content=MILLION_EMPTY,
                              headers={"content-type": "application/json"})
        self._record("million_messages", started, r.status_code == 400 and "--max-messages" in r.text, r.text[:200])

    async def no_key(self, client: httpx.AsyncClient) -> None:
        started = time.monotonic()
        r = await client.post("/v1/chat/completions", json=self._chat(), headers={"Authorization": "Bearer wrong"})
        self._record("no_key", started, r.status_code == 401, f"{r.status_code} {r.text[:200]}")

    async def _raw(self, rcvbuf: int | None = None) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        sock = socket.socket()
        if rcvbuf:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        sock.setblocking(False)
        await asyncio.get_running_loop().sock_connect(sock, (self.host, int(self.port)))
        return await asyncio.open_connection(sock=sock)

    async def _cut_by_server(self, reader: asyncio.StreamReader, within_s: float) -> bool:
        """Drains what the server sent; True when it closes the connection within ``within_s``."""
        deadline = time.monotonic() + within_s
        try:
            while time.monotonic() < deadline:
                if not await asyncio.wait_for(reader.read(1 << 20), max(deadline - time.monotonic(), 0.01)):
                    return True
        except ConnectionError:  # reset: cut as well
            return True
        except asyncio.TimeoutError:
            return False
        return False

    async def stalled_reader(self) -> None:
        """A streamed speech chat whose client reads nothing: the server must cut it after --send-timeout."""
        started = time.monotonic()
        body = json.dumps(self._chat(stream=True, modalities=["text", "audio"], max_tokens=400,
                                     audio={"voice": "Ethan", "format": "pcm16"})).encode()
        reader, writer = await self._raw(rcvbuf=4096)
        try:
            writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: %s\r\nAuthorization: Bearer %s\r\n"
                         b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                         % (self.host.encode(), API_KEY.encode(), len(body), body))
            await writer.drain()
            await asyncio.sleep(SEND_TIMEOUT_S + 2)  # never reading meanwhile
            # Either the answer was short enough to fit the buffers (it ends), or the server cut it.
            ok = await self._cut_by_server(reader, 30)
            self._record("stalled_reader", started, ok, "the server kept a non-reading stream open")
        finally:
            writer.close()

    async def slowloris(self) -> None:
        started = time.monotonic()
        reader, writer = await self._raw()
        try:
            writer.write(b"GET /health HTTP/1.1\r\nHost: " + self.host.encode() + b"\r\nX-Slow: ")
            await writer.drain()
            ok = await self._cut_by_server(reader, HEADER_TIMEOUT_S + 5)
            self._record("slowloris", started, ok, "the server kept a connection without headers open")
        finally:
            writer.close()

    async def one(self, client: httpx.AsyncClient) -> None:
        pick = self.rng.random()
        try:
            if pick < 0.25:
                await self.whole_chat(client)
            elif pick < 0.5:
                await self.streamed_speech_chat(client)
            elif pick < 0.62:
                await self.streamed_speech_chat(client, leave_after=self.rng.randint(1, 8))
            elif pick < 0.75:
                await self.speech(client)
            elif pick < 0.87:
                await self.hostile(client)
            elif pick < 0.9:
                await self.million_messages(client)
            elif pick < 0.94:
                await self.no_key(client)
            elif pick < 0.97:
                await self.stalled_reader()
            else:
                await self.slowloris()
        except (httpx.HTTPError, OSError) as exc:
            self._record("transport", time.monotonic(), False, repr(exc))

    async def run(self, seconds: float, concurrency: int) -> None:
        deadline = time.monotonic() + seconds

        async def loop() -> None:
            async with httpx.AsyncClient(base_url=self.url, timeout=120,
                                         headers={"Authorization": f"Bearer {API_KEY}"}) as client:
                while time.monotonic() < deadline:
                    await self.one(client)

        await asyncio.gather(*(loop() for _ in range(concurrency)))


def _leftovers(url: str) -> dict[str, float]:
    """Non-zero KV / queue / running / shm gauges from /metrics."""
    text = httpx.get(f"{url}/metrics", timeout=10, headers={"Authorization": f"Bearer {API_KEY}"}).text
    out = {}
    for line in text.splitlines():
        if line.startswith(("omnistage_kv_blocks_used", "omnistage_queue_depth", "omnistage_requests_running",
                            "omnistage_shm_segments")):
            name, value = line.rsplit(" ", 1)
            if float(value):
                out[name] = float(value)
    return out


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start_server(model: str) -> tuple[subprocess.Popen, str]:
    port = _free_port()
    exe = Path(sys.executable).with_name("omnistage")
    proc = subprocess.Popen([str(exe), "serve", "--model", model, "--port", str(port), "--talker-min-new-tokens",
                             "8", "--api-key", API_KEY, "--send-timeout", str(SEND_TIMEOUT_S), "--header-timeout",
                             str(HEADER_TIMEOUT_S)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        if proc.poll() is not None:
            raise SystemExit(f"the server exited with {proc.returncode}")
        time.sleep(1)
    raise SystemExit("the server did not become healthy")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--url", default=None, help="a running server (default: start one)")
    parser.add_argument("--server-pid", type=int, default=None, help="its pid, for memory (with --url)")
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--warmup-s", type=float, default=20.0)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--sample-s", type=float, default=5.0)
    parser.add_argument("--max-growth-mib", type=float, default=64.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, default=None, help="write the figures here")
    args = parser.parse_args()

    proc = None
    if args.url is None:
        proc, url = _start_server(args.model)
        pid = proc.pid
    else:
        url, pid = args.url.rstrip("/"), args.server_pid
    soak = Soak(url, args.model, args.seed)
    samples: list[tuple[float, int]] = []
    try:
        async def run() -> None:
            async def sample() -> None:
                start = time.monotonic()
                while True:
                    if pid is not None:
                        samples.append((time.monotonic() - start, _rss_kib(pid)))
                    await asyncio.sleep(args.sample_s)

            sampler = asyncio.ensure_future(sample())
            try:
                await soak.run(args.minutes * 60, args.concurrency)
            finally:
                sampler.cancel()

        started = time.monotonic()
        asyncio.run(run())
        elapsed = time.monotonic() - started
        time.sleep(2)
        leftovers = _leftovers(url)
        healthy = httpx.get(f"{url}/health", timeout=10).status_code == 200
    finally:
        if proc is not None:
            os.killpg(proc.pid, signal.SIGINT)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)

    steady = [(t, kib) for t, kib in samples if t >= args.warmup_s] or samples
    quarter = max(len(steady) // 4, 1)
    first = sum(k for _, k in steady[:quarter]) / quarter / 1024 if steady else 0.0
    last = sum(k for _, k in steady[-quarter:]) / quarter / 1024 if steady else 0.0
    requests = sum(v for k, v in soak.counts.items() if k != "errors")
    figures = {
        "seconds": round(elapsed, 1), "requests": requests, "per_kind": {k: v for k, v in soak.counts.items()},
        "errors": soak.counts["errors"], "error_samples": soak.errors,
        "p50_s": {k: round(sorted(v)[len(v) // 2], 3) for k, v in soak.latencies.items()},
        "p95_s": {k: round(sorted(v)[int(len(v) * 0.95)], 3) for k, v in soak.latencies.items()},
        "rss_mib_first_quarter": round(first, 1), "rss_mib_last_quarter": round(last, 1),
        "rss_growth_mib": round(last - first, 1),
        "rss_mib_min_max": [round(min(k for _, k in samples) / 1024, 1), round(max(k for _, k in samples) / 1024, 1)]
        if samples else None,
        "leftovers": leftovers, "healthy_after": healthy,
    }
    print(json.dumps(figures, indent=2))
    if args.json is not None:
        args.json.write_text(json.dumps(figures, indent=2))
    ok = not soak.counts["errors"] and not leftovers and healthy and (pid is None or last - first < args.max_growth_mib)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
