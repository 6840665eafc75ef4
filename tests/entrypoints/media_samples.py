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


def mp4_bytes(seconds: float = 2.0, fps: int = 10, size: int = 64, tone_hz: float | None = None,
              audio_rate: int = 44100) -> bytes:
    """An H.264-free video (MPEG-4 part 2 in MP4) so any FFmpeg build can write it; with ``tone_hz``, an AAC
    sound track of that sine at ``audio_rate``, as long as the video."""
    buf = io.BytesIO()
    with av.open(buf, mode="w", format="mp4") as container:
        stream = container.add_stream("mpeg4", rate=fps)
        stream.width = stream.height = size
        stream.pix_fmt = "yuv420p"
        sound = container.add_stream("aac", rate=audio_rate, layout="mono") if tone_hz is not None else None
        for i in range(int(seconds * fps)):
            pixels = np.full((size, size, 3), (i * 10) % 255, dtype=np.uint8)
            for packet in stream.encode(av.VideoFrame.from_ndarray(pixels, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode(None):
            container.mux(packet)
        if sound is not None:
            _write_tone(container, sound, tone_hz, seconds, audio_rate)
    return buf.getvalue()


def _write_tone(container: av.container.OutputContainer, stream: av.audio.stream.AudioStream, hz: float,
                seconds: float, rate: int) -> None:
    t = np.arange(int(seconds * rate)) / rate
    samples = (0.3 * np.sin(2 * np.pi * hz * t)).astype(np.float32)
    size = stream.codec_context.frame_size or 1024
    for start in range(0, len(samples), size):
        frame = av.AudioFrame.from_ndarray(samples[None, start:start + size], format="fltp", layout="mono")
        frame.sample_rate, frame.pts = rate, start
        for packet in stream.encode(frame):
            container.mux(packet)
    for packet in stream.encode(None):
        container.mux(packet)
