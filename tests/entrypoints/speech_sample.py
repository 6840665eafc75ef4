"""A short spoken sentence for the WebRTC tests: espeak-ng's voice, or (without espeak-ng) a voiced stand-in."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path

import numpy as np
import soundfile as sf

from omnistage.audio.decode import resample


def speech(text: str, rate: int) -> tuple[np.ndarray, str]:
    """Mono float32 at ``rate`` and where it came from ("espeak-ng" or "synthetic")."""
    if shutil.which("espeak-ng") is None:
        # A 150 Hz voice with harmonics for 1.2 s: an energy VAD hears it as speech, as it would espeak's.
        t = np.arange(int(1.2 * rate)) / rate
        voice = sum(np.sin(2 * np.pi * 150 * k * t) / k for k in range(1, 8))
        return (0.3 * voice / np.abs(voice).max()).astype(np.float32), "synthetic"
    with tempfile.TemporaryDirectory() as tmp:
        wav = Path(tmp) / "speech.wav"
        subprocess.run(["espeak-ng", "-w", str(wav), text], check=True, capture_output=True, timeout=30)
        samples, source_rate = sf.read(wav, dtype="float32")
    return resample(samples, source_rate, rate), "espeak-ng"


def write_wav(path: Path, samples: np.ndarray, rate: int, lead_s: float = 0.0, tail_s: float = 0.0) -> Path:
    """16-bit mono WAV with silence around the speech (Chromium's fake microphone loops the file)."""
    silence = np.zeros(int(lead_s * rate), np.float32), np.zeros(int(tail_s * rate), np.float32)
    sf.write(path, np.concatenate([silence[0], samples, silence[1]]), rate, subtype="PCM_16")
    return path
