"""Recorded-speech-like audio for ``omnistage bench realtime``: espeak-ng sentences as 24 kHz PCM16.

Silero VAD (the server's default detector) hears synthetic tones as noise, so the
benchmark speaks real words: one espeak-ng paragraph, made once per run, its
pauses shortened below the server's end-of-turn silence (so one utterance stays
one turn), looped or cut to each utterance length. Without espeak-ng a voiced
harmonic stand-in is used (the energy detector hears it; Silero may not).
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path

import numpy as np

RATE = 24000  # the realtime API's PCM16 rate
# A microphone's packet: one input_audio_buffer.append per 20 ms, as a WebRTC client sends Opus frames (browsers'
# and SDKs' WebSocket clients send 20-100 ms). Larger packets quantise when the server hears the silence after speech
# (a 100 ms packet delays it by up to 100 ms), which then shows up as turn-detection latency.
APPEND_S = 0.02
MAX_PAUSE_S = 0.2  # longest pause kept inside an utterance (server VAD ends a turn after 500 ms)
TEXT = ("The quick brown fox jumps over the lazy dog, and then it runs back across the field to the old farm "
        "house. I would like to know what the weather will be like tomorrow, because we are planning a long "
        "walk by the river with the children, and maybe a picnic near the bridge if it does not rain.")


def synthesize(text: str = TEXT) -> tuple[np.ndarray, str]:
    """Mono float32 at 24 kHz and where it came from ("espeak-ng" or "synthetic")."""
    if shutil.which("espeak-ng") is None:
        t = np.arange(int(4 * RATE)) / RATE
        voice = sum(np.sin(2 * np.pi * 150 * k * t) / k for k in range(1, 8))
        syllables = (np.sin(2 * np.pi * 3 * t) > -0.5).astype(np.float32)  # 3 Hz syllable rhythm
        return (0.3 * voice * syllables / np.abs(voice).max()).astype(np.float32), "synthetic"
    import soundfile as sf

    from omnistage.audio.decode import resample

    with tempfile.TemporaryDirectory() as tmp:
        wav = Path(tmp) / "speech.wav"
        subprocess.run(["espeak-ng", "-w", str(wav), text], check=True, capture_output=True, timeout=60)
        samples, rate = sf.read(wav, dtype="float32")
    if samples.ndim > 1:
        samples = samples.mean(axis=1)
    return resample(samples, rate, RATE).astype(np.float32), "espeak-ng"


def shorten_pauses(samples: np.ndarray, max_pause_s: float = MAX_PAUSE_S, level: float = 1e-3) -> np.ndarray:
    """Cuts every quiet run longer than ``max_pause_s`` down to that length (and trims both ends)."""
    frame = RATE // 100
    n = len(samples) // frame
    loud = np.abs(samples[:n * frame]).reshape(n, frame).max(axis=1) > level
    keep, quiet, limit = [], 0, int(max_pause_s * 100)
    for i in range(n):
        quiet = 0 if loud[i] else quiet + 1
        if quiet <= limit:
            keep.append(i)
    frames = samples[:n * frame].reshape(n, frame)[keep]
    loud_idx = np.flatnonzero(np.abs(frames).max(axis=1) > level)
    if len(loud_idx) == 0:
        return frames.reshape(-1)
    return frames[loud_idx[0]:loud_idx[-1] + 1].reshape(-1)


def utterance(speech: np.ndarray, seconds: float, end_s: float | None = None) -> np.ndarray:
    """``seconds`` of the looped paragraph (its loops joined by a pause, as between sentences) that end ``end_s``
    into it (None: the ones from its start). Utterances of any length with the same ``end_s`` end with the same
    words, so server VAD hears the same end of speech and waits the same silence after each."""
    gap = np.zeros(int(MAX_PAUSE_S * RATE), np.float32)
    period, n = len(speech) + len(gap), int(seconds * RATE)
    end = n if end_s is None else int(end_s * RATE) % period
    while end < n:  # the same point a loop later, so that n samples come before it
        end += period
    looped = np.concatenate([np.concatenate([speech, gap])] * (end // period + 1))
    return looped[end - n:end]


def pcm16(samples: np.ndarray) -> bytes:
    return (np.clip(samples, -1.0, 1.0) * 32767).astype("<i2").tobytes()


def appends(samples: np.ndarray, packet_s: float = APPEND_S) -> list[bytes]:
    """The PCM16 packets of ``packet_s`` a microphone would deliver (the last one may be shorter)."""
    step = int(packet_s * RATE)
    return [pcm16(samples[i:i + step]) for i in range(0, len(samples), step)]


def silence_packet(packet_s: float = APPEND_S) -> bytes:
    return bytes(2 * int(packet_s * RATE))
