"""N GPT-Live sessions against a served duplex model (``omnistage serve moshi-tiny``), each streaming espeak-ng
speech over the WebSocket at real-time pace for S seconds through the unchanged ``openai`` SDK.

    python scripts/served_duplex.py --url http://127.0.0.1:8000 --model moshi-tiny --sessions 2 --seconds 30

Per session, from what the client receives: agent frames (``session.output_audio.delta``), late frames (a delta of
exact digital silence: the engine sends a frame whose step missed its deadline as zeros), transcript deltas, and
underruns (a frame arriving after the one before it finished playing, one frame buffered). A refused session
(``session_capacity_exceeded``) is reported as such.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import time
from dataclasses import asdict, dataclass, field

import numpy as np
import openai

from omnistage.tools.bench.realtime_speech import synthesize

RATE, FRAME_S = 24000, 0.08


@dataclass
class SessionRun:
    frames: int = 0
    late_frames: int = 0
    transcript_deltas: int = 0
    underruns: int = 0
    refused: str = ""
    arrivals: list[float] = field(default_factory=list, repr=False)

    def count_underruns(self) -> None:
        start = self.arrivals[0] + FRAME_S if self.arrivals else 0.0
        self.underruns = sum(t > start + i * FRAME_S for i, t in enumerate(self.arrivals))


async def one_session(url: str, model: str, seconds: float, phase_s: float, speech: bytes) -> SessionRun:
    run = SessionRun()
    client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
    async with client.live.connect() as conn:
        await conn.session.start(session={"model": model})
        first = (await conn.recv()).to_dict()
        if first["type"] != "session.started":
            run.refused = first.get("error", {}).get("code", first["type"])
            return run
        reader = asyncio.create_task(_read(conn, run))
        piece = RATE * 2 * 80 // 1000  # one 80 ms frame of PCM16
        start, i = time.monotonic() + phase_s, 0
        while time.monotonic() < start + seconds:
            await asyncio.sleep(max(0.0, start + i * FRAME_S - time.monotonic()))
            at = (i * piece) % (len(speech) - piece)
            await conn.session.input_audio.append(audio=base64.b64encode(speech[at:at + piece]).decode())
            i += 1
        await conn.session.close()
        await reader
    run.count_underruns()
    return run


async def _read(conn: object, run: SessionRun) -> None:
    while True:
        event = (await conn.recv()).to_dict()  # type: ignore[attr-defined]
        if event["type"] == "session.output_audio.delta":
            run.arrivals.append(time.monotonic())
            run.frames += 1
            run.late_frames += not any(base64.b64decode(event["delta"]))
        elif event["type"] == "session.output_transcript.delta":
            run.transcript_deltas += 1
        elif event["type"] == "session.closed":
            return


async def main(args: argparse.Namespace) -> list[SessionRun]:
    samples, _ = synthesize()
    speech = np.concatenate([samples, np.zeros(RATE, np.float32)])
    pcm = (np.clip(speech, -1, 1) * 32767).astype("<i2").tobytes()
    return list(await asyncio.gather(*(one_session(args.url, args.model, args.seconds, k * FRAME_S / args.sessions,
                                                   pcm) for k in range(args.sessions))))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="http://127.0.0.1:8000")
    parser.add_argument("--model", default="moshi-tiny")
    parser.add_argument("--sessions", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=30.0)
    runs = asyncio.run(main(parser.parse_args()))
    print(json.dumps([asdict(r) | {"arrivals": len(r.arrivals)} for r in runs], indent=1))
