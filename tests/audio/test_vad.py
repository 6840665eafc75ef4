"""Turn detection: Silero VAD (the silero-vad package's own model) against synthetic vowels, noise and tones;
the energy fallback; the streaming resampler in front of Silero; the --vad choice."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from scipy.signal import resample_poly

from omnistage.audio.resample_stream import StreamResampler
from omnistage.audio.silero import WINDOW, SileroVad, load_model, model_path
from omnistage.audio.vad import EnergyVad, TurnTracker, VadConfig
from omnistage.audio.vad_backend import vad_backend
from tests.audio.signals import peak_hz, speech_like, tone

CONFIG = VadConfig(silence_duration_ms=300)


def turn(rate: int, seed: int = 0, lead: float = 0.5) -> np.ndarray:
    """``lead`` s of silence, 0.8 s of vowels, 0.5 s of silence."""
    return np.concatenate([np.zeros(int(lead * rate), np.float32), speech_like(0.8, rate, seed),
                           np.zeros(rate // 2, np.float32)])


def edges(vad: SileroVad | EnergyVad, audio: np.ndarray, rate: int) -> list[tuple[str, float]]:
    return [(e.kind, e.sample / rate) for e in vad.feed(audio)]


@pytest.mark.parametrize("rate", [8000, 16000, 24000])
@pytest.mark.parametrize("seed", [0, 1])
def test_silero_finds_the_turn_in_vowels(rate: int, seed: int) -> None:
    found = edges(SileroVad(CONFIG, rate, load_model()), turn(rate, seed), rate)
    assert [k for k, _ in found] == ["speech_started", "speech_stopped"]
    # Speech runs 0.5..1.3 s; Silero decides per 32 ms window and needs two to start (min_speech_ms=60).
    assert 0.45 <= found[0][1] <= 0.6 and 1.2 <= found[1][1] <= 1.45


def test_silero_ignores_loud_noise_and_tones_that_the_energy_detector_calls_speech() -> None:
    rate = 16000
    noise = (0.1 * np.random.default_rng(0).standard_normal(2 * rate)).astype(np.float32)  # -20 dBFS
    for signal in (noise, tone(440, 2.0, rate), tone(1000, 2.0, rate)):
        assert edges(SileroVad(CONFIG, rate, load_model()), signal, rate) == []
        assert edges(EnergyVad(CONFIG, rate), signal, rate)[0][0] == "speech_started"


def test_silero_windows_match_the_packages_own_stateful_wrapper() -> None:
    """Our per-stream state and context handling gives the probabilities of the package's stateful ``forward``
    (the same TorchScript network, so only the bookkeeping differs)."""
    audio = turn(16000)
    whole = torch.jit.load(str(model_path()), map_location="cpu")
    n = len(audio) // WINDOW
    with torch.inference_mode():
        expected = [float(whole(torch.from_numpy(audio[i * WINDOW:(i + 1) * WINDOW]).unsqueeze(0), 16000))
                    for i in range(n)]
    ours = SileroVad(CONFIG, 16000, load_model()).probabilities(audio)
    torch.testing.assert_close(torch.tensor(ours), torch.tensor(expected), rtol=0, atol=1e-5)
    assert max(ours) > 0.9 and max(ours[:10]) < 0.1  # it does hear the vowels, and not the silence before them


def test_silero_pieces_give_the_whole_and_streams_keep_their_own_state() -> None:
    rate = 24000
    a, b = turn(rate, seed=0), turn(rate, seed=1, lead=0.9)[: len(turn(rate))]
    whole_a = SileroVad(CONFIG, rate, load_model()).probabilities(a)
    whole_b = SileroVad(CONFIG, rate, load_model()).probabilities(b)
    va, vb = SileroVad(CONFIG, rate, load_model()), SileroVad(CONFIG, rate, load_model())
    pieces_a: list[float] = []
    pieces_b: list[float] = []
    for i in range(0, len(a), 1237):  # interleaved, in pieces that never line up with a window
        pieces_a += va.probabilities(a[i:i + 1237])
        pieces_b += vb.probabilities(b[i:i + 1237])
    torch.testing.assert_close(torch.tensor(pieces_a), torch.tensor(whole_a), rtol=0, atol=1e-4)
    torch.testing.assert_close(torch.tensor(pieces_b), torch.tensor(whole_b), rtol=0, atol=1e-4)
    assert not np.allclose(whole_a, whole_b, atol=0.05)  # different audio, different answers


def test_silero_reset_starts_a_fresh_stream() -> None:
    vad = SileroVad(CONFIG, 16000, load_model())
    first = edges(vad, turn(16000), 16000)
    vad.reset()
    assert edges(vad, turn(16000), 16000) == first and not vad.in_speech


def test_turn_tracker_hysteresis_and_debounce() -> None:
    tracker = TurnTracker(VadConfig(silence_duration_ms=60, min_speech_ms=40), frame_ms=20)
    # One voiced frame is a click; two start a turn; 0.4 is below the start level but above the stop level.
    scores = [0.9, 0.1, 0.6, 0.6, 0.4, 0.4, 0.4, 0.2, 0.2, 0.6, 0.2, 0.2, 0.2]
    assert tracker.update(scores, start_at=0.5, stop_below=0.35) == [("speech_started", 2), ("speech_stopped", 10)]


def test_stream_resampler_pieces_match_the_whole_and_keep_the_pitch() -> None:
    signal = tone(1000, 1.0, 24000)
    whole = StreamResampler(24000, 16000)(signal)
    resampler = StreamResampler(24000, 16000)
    pieces = np.concatenate([resampler(signal[i:i + 999]) for i in range(0, len(signal), 999)])
    assert len(whole) == len(pieces) == 16000
    torch.testing.assert_close(torch.from_numpy(pieces), torch.from_numpy(whole), rtol=0, atol=1e-6)
    assert abs(peak_hz(whole, 16000) - 1000) <= 1
    # The same signal as scipy's whole-signal resampler, once the filter's delay is allowed for.
    reference = resample_poly(signal, 2, 3)
    delay = resampler.delay
    torch.testing.assert_close(torch.from_numpy(whole[delay + 200:-200]),
                               torch.from_numpy(reference[200:-200 - delay].astype(np.float32)), rtol=0, atol=0.02)
    up = StreamResampler(8000, 16000)(tone(300, 0.5, 8000))
    assert len(up) == 8000 and abs(peak_hz(up, 16000) - 300) <= 2


def test_vad_backend_choice() -> None:
    assert vad_backend("auto").name == "silero"  # the package is a dependency: its model loads
    assert isinstance(vad_backend("silero").make(CONFIG, 16000), SileroVad)
    assert isinstance(vad_backend("energy").make(CONFIG, 16000), EnergyVad)
    assert vad_backend("silero").make(None, 16000) is None  # turn_detection: null
    with pytest.raises(ValueError, match="--vad"):
        vad_backend("webrtc")


def test_model_is_loaded_without_touching_torchs_thread_count() -> None:
    before = torch.get_num_threads()
    load_model.cache_clear()
    load_model()
    assert torch.get_num_threads() == before  # the package's __init__ would have set it to 1


def test_auto_falls_back_to_the_energy_detector_without_the_model(tmp_path: Path) -> None:
    """A silero_vad package without its model file, first on the path (a fresh interpreter: nothing patched)."""
    (tmp_path / "silero_vad").mkdir()
    (tmp_path / "silero_vad" / "__init__.py").write_text("raise RuntimeError('never imported')\n")
    script = ("from omnistage.audio.silero import SileroUnavailable\n"
              "from omnistage.audio.vad_backend import vad_backend\n"
              "print(vad_backend('auto').name)\n"
              "try:\n    vad_backend('silero')\nexcept SileroUnavailable as exc:\n    print('refused:', exc)\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(Path.cwd())])}
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == "energy" and lines[1].startswith("refused: silero-vad has no model file")
    assert "falls back to the energy detector" in out.stderr


def test_a_pause_inside_a_turn_is_reported_then_resumed_or_stopped() -> None:
    """``pause_ms``: a turn's silence reports a pause once (at the end of what was heard), then a resume if voice
    comes back before the turn stops, or the stop; shorter silences and pause_ms >= the silence report none."""
    rate = 16000
    quiet = lambda s: np.zeros(int(s * rate), np.float32)  # noqa: E731
    audio = np.concatenate([quiet(0.3), speech_like(0.6, rate, 1), quiet(0.25), speech_like(0.6, rate, 2),
                            quiet(0.06), speech_like(0.3, rate, 3), quiet(0.6)])
    config = VadConfig(silence_duration_ms=500, pause_ms=200)
    found = edges(EnergyVad(config, rate), audio, rate)
    assert [k for k, _ in found] == ["speech_started", "speech_paused", "speech_resumed", "speech_paused",
                                     "speech_stopped"]
    (_, start), (_, pause), (_, back), (_, last), (_, stop) = found
    assert abs(pause - (0.9 + 0.2)) <= 0.02 and abs(back - 1.15) <= 0.02  # 200 ms into the 250 ms gap; its end
    assert abs(last - stop - 0.2) <= 0.02 and abs(stop - 2.05) <= 0.1  # the stop names the silence's start
    for pause_ms in (0, 500, 800):
        kinds = [k for k, _ in edges(EnergyVad(VadConfig(silence_duration_ms=500, pause_ms=pause_ms), rate), audio,
                                     rate)]
        assert kinds == ["speech_started", "speech_stopped"]
    tracker = TurnTracker(config, 20)  # fed frame by frame: the same edges
    scores = [1.0] * 10 + [0.0] * 10 + [1.0] + [0.0] * 30
    assert [k for k, _ in tracker.update(scores, 0.5, 0.5)] == ["speech_started", "speech_paused",
                                                                "speech_resumed", "speech_paused", "speech_stopped"]
