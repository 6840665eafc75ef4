"""``omnistage bench speech-stream``: text spoken as it is written, over ``WS /v1/audio/speech/stream``.

Each session is a client writing its text at an LLM's pace (``--tokens-per-s``, default 20): the text is cut into
LLM-sized pieces (a word's leading space and at most four characters, or one punctuation mark: English LLM
tokens average about four characters) sent one every 1/rate seconds, then ``input_text.done``. Figures per
session: first audio after the first piece was sent, whether a player started at the first audio would run dry
(underrun, as ``bench serve`` counts it), the audio's and the text's seconds; then percentiles over the sessions.
The session's mode is the server's (``session.created``): on a family that takes text deltas (Qwen3-TTS) the
utterance starts on the first words; on others, at the first sentence end.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import json
import re
import time

import numpy as np

from omnistage.audio.formats import PCM_RATE
from omnistage.tools.bench.metrics import StreamRecord
from omnistage.tools.bench.realtime import local_server

TEXT = ("Sure, here is a short answer. The weather today is mild, with a light breeze from the west and a few "
        "clouds in the afternoon. If you go out later, take a jacket, because it will cool down quickly after "
        "sunset. Tomorrow looks brighter, and the weekend should stay dry.")
LLM_PIECE = re.compile(r"\s?[^\W_]{1,4}|\s?[^\w\s]|\s+")


def llm_pieces(text: str) -> list[str]:
    """``text`` cut as an LLM's deltas come (about four characters each); joined, the text."""
    pieces = LLM_PIECE.findall(text)
    if "".join(pieces) != text:
        raise ValueError("the text has characters the piece pattern skips")
    return pieces


async def _send(ws, pieces: list[str], interval_s: float, record: StreamRecord) -> None:  # noqa: ANN001
    begin = time.perf_counter()
    for k, piece in enumerate(pieces):
        await asyncio.sleep(max(0.0, begin + k * interval_s - time.perf_counter()))
        if k == 0:
            record.start = time.perf_counter()
        await ws.send(json.dumps({"type": "input_text.delta", "delta": piece}))
    await ws.send(json.dumps({"type": "input_text.done"}))


async def session(url: str, model: str, voice: str | None, pieces: list[str], rate: float,
                  text_input: str | None = None, audio_s: float = 0.0) -> tuple[StreamRecord, str]:
    """One client: (its record, the mode it spoke in). ``audio_s`` > 0: it cancels once it has heard that much (a
    random checkpoint's talker speaks to its frame bound, minutes for a long text)."""
    from websockets.asyncio.client import connect

    record = StreamRecord(start=time.perf_counter(), rate=PCM_RATE)
    ws_url = url.replace("http://", "ws://") + f"/v1/audio/speech/stream?model={model}"
    async with connect(ws_url, open_timeout=30, max_size=None) as ws:
        mode = json.loads(await ws.recv()).get("session", {}).get("text_input", "?")
        update = {**({"voice": voice} if voice else {}), **({"text_input": text_input} if text_input else {})}
        if update:
            await ws.send(json.dumps({"type": "session.update", **update}))
            mode = text_input or mode
        sender = asyncio.create_task(_send(ws, pieces, 1.0 / rate, record))
        cancelled = False
        try:
            async for message in ws:
                event = json.loads(message)
                if event["type"] == "speech.audio.delta":
                    record.add_audio(time.perf_counter(), len(base64.b64decode(event["audio"])) // 2)
                    if 0 < audio_s <= record.audio_seconds and not cancelled:
                        cancelled = True
                        sender.cancel()
                        await ws.send(json.dumps({"type": "input_text.cancel"}))
                elif event["type"] == "error":
                    record.error = event["error"]["message"]
                elif event["type"] == "speech.audio.done":
                    record.end = time.perf_counter()
        finally:
            sender.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sender
    return record, mode


def summarize(records: list[StreamRecord], text_s: float) -> dict[str, object]:
    firsts = [1000 * r.audio_ttfp for r in records if r.audio_ttfp is not None]
    shortfalls = [r.underrun_s() for r in records if r.audio]
    out: dict[str, object] = {"sessions": len(records), "errors": sum(1 for r in records if r.error),
                              "text_s": round(text_s, 2),
                              "audio_s": [round(r.audio_seconds, 2) for r in records],
                              "first_audio_ms": [round(v, 1) for v in firsts],
                              "underrun_streams": sum(1 for s in shortfalls if s > 0),
                              "max_underrun_ms": round(1000 * max(shortfalls, default=0.0), 1)}
    if firsts:
        out.update({f"p{p}_first_audio_ms": round(float(np.percentile(firsts, p)), 1) for p in (50, 90)})
        out["max_first_audio_ms"] = round(max(firsts), 1)
    return out


async def _bench(url: str, model: str, args: argparse.Namespace) -> dict[str, object]:
    pieces = llm_pieces(args.text or TEXT)
    for _ in range(args.warmup):  # the server's first utterance pays its one-time costs: not measured
        await session(url, model, args.voice, pieces, args.tokens_per_s, args.text_input, args.audio_seconds)
    records, modes = [], set()
    for _ in range(args.sessions):  # one after another: each session's figures without the others' load
        runs = await asyncio.gather(*(session(url, model, args.voice, pieces, args.tokens_per_s, args.text_input,
                                              args.audio_seconds) for _ in range(args.concurrency)))
        for record, mode in runs:
            records.append(record)
            modes.add(mode)
    out = summarize(records, len(pieces) / args.tokens_per_s)
    return {"model": model, "text_input": sorted(modes), "tokens_per_s": args.tokens_per_s, "warmup": args.warmup,
            "audio_seconds_heard": args.audio_seconds,
            "pieces": len(pieces), "concurrency": args.concurrency, **out}


def main(args: argparse.Namespace) -> int:
    import httpx

    def run(url: str) -> dict[str, object]:
        model = args.served_model or httpx.get(f"{url}/v1/models", timeout=30).json()["data"][0]["id"]
        return asyncio.run(_bench(url, model, args))

    if args.url:
        figures = run(args.url.rstrip("/"))
    else:
        with local_server(args.model, args.server_args.split()) as url:
            figures = run(url)
    print(json.dumps(figures, indent=1))
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump(figures, f, indent=1)
    return 0 if not figures["errors"] else 1
