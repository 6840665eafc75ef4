"""Commit → first audio over ``WS /v1/realtime``: N concurrent sessions each stream ~1 s of spoken-like
PCM16 in 100 ms pieces, commit, ask for a response, and time ``input_audio_buffer.commit`` →
first ``response.output_audio.delta``.

    python -m omnistage.entrypoints.openai.realtime_bench --url ws://127.0.0.1:8000/v1/realtime \\
        --sessions 1,8 --rounds 3

Without ``--url`` it starts the tiny pipeline (stage processes) and a server itself.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import statistics
import threading
import time

import numpy as np


def spoken_like(seconds: float, rate: int) -> np.ndarray:
    t = np.arange(int(seconds * rate)) / rate
    phase = 2 * np.pi * np.cumsum(140 + 30 * np.sin(2 * np.pi * 0.7 * t)) / rate
    voiced = sum(np.sin(k * phase) / k for k in range(1, 6))
    return (0.2 * (0.25 + 0.75 * np.abs(np.sin(4 * np.pi * t))) * voiced).astype(np.float32)


async def one_turn(url: str, pieces: list[str], max_tokens: int) -> float:
    from websockets.asyncio.client import connect

    async with connect(url, max_size=None) as ws:
        await ws.send(json.dumps({"type": "session.update", "session": {
            "audio": {"input": {"format": {"type": "audio/pcm", "rate": 16000}}}}}))
        for piece in pieces:
            await ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": piece}))
            await asyncio.sleep(0.1)  # real time: a piece per 100 ms
        start = time.perf_counter()
        await ws.send(json.dumps({"type": "input_audio_buffer.commit"}))
        await ws.send(json.dumps({"type": "response.create", "response": {"max_output_tokens": max_tokens}}))
        first = None
        while True:
            event = json.loads(await ws.recv())
            if event["type"] == "response.output_audio.delta" and first is None:
                first = time.perf_counter() - start
            elif event["type"] == "error":
                raise RuntimeError(event["error"])
            elif event["type"] == "response.done":
                if first is None:
                    raise RuntimeError(f"no audio: {event['response']['status']}")
                return first


async def measure(url: str, sessions: int, rounds: int, max_tokens: int) -> list[float]:
    pcm = (spoken_like(1.0, 16000) * 32767).astype("<i2").tobytes()
    pieces = [base64.b64encode(pcm[i:i + 3200]).decode() for i in range(0, len(pcm), 3200)]
    out: list[float] = []
    for _ in range(rounds):
        out += await asyncio.gather(*(one_turn(url, pieces, max_tokens) for _ in range(sessions)))
    return out


def _serve_tiny(audio_frames: int) -> tuple[str, object, object]:
    import uvicorn

    from omnistage.entrypoints.openai.api_server import build_app
    from omnistage.pipeline.async_omni import AsyncOmni
    from omnistage.pipeline.runtime import PipelineOptions

    engine = AsyncOmni("tiny", None, PipelineOptions(talker_min_new_tokens=audio_frames), "tiny")
    server = uvicorn.Server(uvicorn.Config(build_app(engine), host="127.0.0.1", port=0, log_level="warning"))
    threading.Thread(target=server.run, daemon=True).start()
    while not server.started:
        time.sleep(0.05)
    port = server.servers[0].sockets[0].getsockname()[1]
    return f"ws://127.0.0.1:{port}/v1/realtime", engine, server


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default=None)
    parser.add_argument("--sessions", default="1,8")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--audio-frames", type=int, default=24, help="talker frames forced (tiny model)")
    args = parser.parse_args()
    engine = server = None
    url = args.url
    if url is None:
        url, engine, server = _serve_tiny(args.audio_frames)
    try:
        asyncio.run(measure(url, 1, 1, args.max_tokens))  # warm-up
        for n in (int(x) for x in args.sessions.split(",")):
            times = sorted(asyncio.run(measure(url, n, args.rounds, args.max_tokens)))
            p90 = times[min(len(times) - 1, int(0.9 * len(times)))]
            print(json.dumps({"sessions": n, "turns": len(times), "commit_to_first_audio_ms": {
                "median": round(1000 * statistics.median(times)), "p90": round(1000 * p90),
                "max": round(1000 * times[-1])}}))
    finally:
        if server is not None:
            server.should_exit = True
            time.sleep(0.5)
            asyncio.run(engine.shutdown())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
