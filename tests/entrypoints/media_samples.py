"""Small media files made in memory for the API tests."""

from __future__ import annotations

import base64
import io

import av
import numpy as np
from PIL import Image


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def data_url(mime: str, data: bytes) -> str:
    return f"data:{mime};base64,{b64(data)}"


def png_bytes(width: int = 64, height: int = 48, color: tuple[int, int, int] = (200, 30, 30)) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (width, height), color).save(buf, format="PNG")
    return buf.getvalue()


def mp4_bytes(seconds: float = 2.0, fps: int = 10, size: int = 64) -> bytes:
    """An H.264-free video (MPEG-4 part 2 in MP4) so any FFmpeg build can write it."""
    buf = io.BytesIO()
    with av.open(buf, mode="w", format="mp4") as container:
        stream = container.add_stream("mpeg4", rate=fps)
        stream.width = stream.height = size
        stream.pix_fmt = "yuv420p"
        for i in range(int(seconds * fps)):
            pixels = np.full((size, size, 3), (i * 10) % 255, dtype=np.uint8)
            for packet in stream.encode(av.VideoFrame.from_ndarray(pixels, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode(None):
            container.mux(packet)
    return buf.getvalue()
