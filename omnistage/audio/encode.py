"""Encoding float32 mono audio into the formats the API returns.

Whole files: soundfile (libsndfile) writes WAV and FLAC, PyAV (FFmpeg) writes
MP3, Ogg/Opus and AAC, and PCM16 is the raw samples. ``StreamingAudioEncoder``
produces the same formats piece by piece so a response can be sent while the
model still speaks: the pieces concatenated form one valid file.

FLAC is the exception: it is held until the audio ends and sent as one piece.
Its STREAMINFO must carry the exact sample count for libsndfile (python-soundfile)
to read it: a streamed header says 0 ("unknown"), which libsndfile turns into
2**63-1 frames ("array is too big"), and any other guess fails its seek to the
end of the data. The bytes are then exactly the non-streamed file's.
"""

from __future__ import annotations

import base64
import io
import struct

import av
import numpy as np
import soundfile as sf

from omnistage.audio.formats import AudioFormat
from omnistage.audio.pcm16 import float_to_pcm16, pcm16_base64
from omnistage.audio.resample_stream import StreamResampler

# FFmpeg muxer and encoder per compressed format.
_AV_CODECS: dict[AudioFormat, tuple[str, str]] = {
    AudioFormat.MP3: ("mp3", "libmp3lame"),
    AudioFormat.OPUS: ("ogg", "libopus"),
    AudioFormat.AAC: ("adts", "aac"),
}
# Ogg buffers a page per second by default; 20 ms pages let each piece carry the audio fed so far.
_MUXER_OPTIONS: dict[AudioFormat, dict[str, str]] = {AudioFormat.OPUS: {"page_duration": "20000"}}
_SOUNDFILE_FORMATS: dict[AudioFormat, str] = {AudioFormat.WAV: "WAV", AudioFormat.FLAC: "FLAC"}
# Formats a reader can only take whole (see the module docstring): held until ``finish``.
HELD_FORMATS: frozenset[AudioFormat] = frozenset({AudioFormat.FLAC})


def encode_audio(samples: np.ndarray, source_rate: int, fmt: AudioFormat) -> bytes:
    """One complete file of ``fmt`` holding ``samples`` (float32 mono at ``source_rate``), at the format's wire
    rate (:meth:`AudioFormat.wire_rate`): the same samples a streamed encoding of them holds."""
    sample_rate = fmt.wire_rate(source_rate)
    samples = StreamResampler(source_rate, sample_rate)(samples)
    return _encode_at(samples, sample_rate, fmt)


def _encode_at(samples: np.ndarray, sample_rate: int, fmt: AudioFormat) -> bytes:
    if fmt is AudioFormat.PCM16:
        return float_to_pcm16(samples)
    if fmt in _SOUNDFILE_FORMATS:
        buf = io.BytesIO()
        # The PCM16 path's own integers, so every PCM16-based format (streamed or not) holds the same samples.
        ints = np.frombuffer(float_to_pcm16(samples), dtype="<i2")
        sf.write(buf, ints, sample_rate, format=_SOUNDFILE_FORMATS[fmt], subtype="PCM_16")
        return buf.getvalue()
    encoder = StreamingAudioEncoder(fmt, sample_rate)  # already at its wire rate: no resampling
    return encoder.feed(samples) + encoder.finish()


def streaming_wav_header(sample_rate: int) -> bytes:
    """A PCM16 mono WAV header whose sizes say 'unknown' (0xFFFFFFFF), the usual way to stream WAV."""
    byte_rate = sample_rate * 2
    return (b"RIFF" + struct.pack("<I", 0xFFFFFFFF) + b"WAVE"
            + b"fmt " + struct.pack("<IHHIIHH", 16, 1, 1, sample_rate, byte_rate, 2, 16)
            + b"data" + struct.pack("<I", 0xFFFFFFFF))


class _Sink:
    """A write-only file object for FFmpeg: no ``seek``, so muxers write straight through."""

    def __init__(self) -> None:
        self._parts: list[bytes] = []

    def write(self, data: bytes | memoryview) -> int:
        self._parts.append(bytes(data))
        return len(data)

    def drain(self) -> bytes:
        out = b"".join(self._parts)
        self._parts.clear()
        return out


class StreamingAudioEncoder:
    """Encodes audio fed in chunks; ``feed`` and ``finish`` return the bytes ready so far.

    WAV streams a header with unknown sizes followed by PCM16; PCM16 streams the
    raw samples; FLAC (``HELD_FORMATS``) is held and encoded whole by ``finish``;
    the others go through an FFmpeg muxer writing to a sink that is drained after
    every chunk. Compressed encoders need whole codec frames, so an ``AudioFifo``
    holds the remainder until the next chunk or ``finish``. Audio fed at
    ``source_rate`` (the served family's) is written at the format's wire rate
    (``sample_rate``), resampled as it comes, chunk by chunk as whole.
    """

    def __init__(self, fmt: AudioFormat, source_rate: int) -> None:
        self.format = fmt
        self.sample_rate = sample_rate = fmt.wire_rate(source_rate)
        self._resample = StreamResampler(source_rate, sample_rate)
        self._header_sent = False
        self._finished = False
        self._sink = _Sink()
        self._container: av.container.OutputContainer | None = None
        self._held: list[np.ndarray] = []
        if fmt in _AV_CODECS:
            muxer, codec = _AV_CODECS[fmt]
            self._container = av.open(self._sink, mode="w", format=muxer, options=_MUXER_OPTIONS.get(fmt, {}))
            self._stream = self._container.add_stream(codec, rate=sample_rate, layout="mono")
            self._fifo = av.AudioFifo()

    def feed(self, samples: np.ndarray) -> bytes:
        if self._finished:
            raise RuntimeError("feed() after finish()")
        samples = self._resample(samples)
        if self.format in HELD_FORMATS:
            self._held.append(np.asarray(samples, dtype=np.float32).reshape(-1))
            return b""
        if self._container is None:
            return self._header() + float_to_pcm16(samples)
        mono = np.ascontiguousarray(np.asarray(samples, dtype=np.float32).reshape(1, -1))
        if mono.shape[1] == 0:
            return b""
        frame = av.AudioFrame.from_ndarray(mono, format="flt", layout="mono")
        frame.sample_rate = self.sample_rate
        self._fifo.write(frame)
        frame_size = self._stream.codec_context.frame_size or 1024
        while self._fifo.samples >= frame_size:
            self._encode(self._fifo.read(frame_size))
        return self._sink.drain()

    def feed_base64(self, samples: np.ndarray, head: bytes = b"", tail: bytes = b"") -> bytes:
        """``head``, the base64 text of what :meth:`feed` returns for ``samples``, then ``tail``; nothing when that
        is nothing. Raw PCM16 is converted and encoded in one pass (:func:`pcm16_base64`)."""
        if self.format is not AudioFormat.PCM16 or self._finished:
            data = self.feed(samples)
            return b"".join((head, base64.b64encode(data), tail)) if data else b""
        samples = self._resample(samples)
        return pcm16_base64(samples, head, tail) if samples.size else b""

    def finish(self) -> bytes:
        if self._finished:
            return b""
        self._finished = True
        if self.format in HELD_FORMATS:
            held, self._held = self._held, []
            return _encode_at(np.concatenate(held) if held else np.zeros(0, np.float32), self.sample_rate,
                              self.format)
        if self._container is None:
            return self._header()
        rest = self._fifo.read()
        if rest is not None:
            self._encode(rest)
        self._encode(None)
        self._container.close()
        self._container = None
        return self._sink.drain()

    def _encode(self, frame: av.AudioFrame | None) -> None:
        assert self._container is not None
        for packet in self._stream.encode(frame):
            self._container.mux(packet)

    def _header(self) -> bytes:
        if self._header_sent or self.format is not AudioFormat.WAV:
            return b""
        self._header_sent = True
        return streaming_wav_header(self.sample_rate)
