"""The small hostile chat bodies ``soak.py`` mixes into its normal traffic (each must be answered with a 4xx), and
the million empty messages (a 400 naming --max-messages)."""

from __future__ import annotations

import base64
import json
import struct
import zlib


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
