"""``bench serve --baseline pocket-tts``: the same random Pocket TTS checkpoint rewritten in the ``pocket-tts``
package's layout loads strictly into the package's own model (every name and shape), and the package generates
from it; another family's checkpoint is a clear usage error."""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import pytest
import soundfile as sf

from omnistage.families.pocket_tts.make_tiny import make_tiny_pocket
from omnistage.tools.bench.pocket_env import PocketTTSUnavailable, pocket_tts_path, run_pocket_tts
from omnistage.tools.bench.pocket_native import _interleave, write_native
from omnistage.tools.bench.speech import _baseline
from omnistage.tools.verify.tts_compare import synthetic_voice
from omnistage.usage_error import UsageError


def test_rotary_rows_interleave_per_head():
    import torch

    rows = torch.arange(8.0)[:, None]  # two heads of four: (0 1 | 2 3), (4 5 | 6 7)
    assert _interleave(rows, 4)[:, 0].tolist() == [0, 2, 1, 3, 4, 6, 5, 7]


def test_the_package_runs_the_converted_checkpoint(tmp_path: Path):
    try:
        pocket_tts_path()
    except PocketTTSUnavailable as exc:
        pytest.skip(f"pocket-tts cannot be installed here: {exc}")
    folder = make_tiny_pocket(tmp_path / "pocket")
    config = write_native(folder)
    with tempfile.TemporaryDirectory() as tmp:
        sf.write(f"{tmp}/voice.wav", synthetic_voice(1.0), 24000)
        out = run_pocket_tts({"config": str(config), "texts": ["Hello there."], "voice_wav": f"{tmp}/voice.wav",
                              "threads": 1}, Path(tmp))
    run = out["runs"][0]
    # A random EOS head never fires: the package runs its whole frame budget, whole 80 ms frames of audio.
    assert run["audio_s"] > 1.0 and round(run["audio_s"] / 0.08, 6) == int(run["audio_s"] / 0.08 + 0.5)
    assert 0 < run["ttfp_s"] <= run["e2e_s"]
    assert 0 < run["cpu_s"] < 4 * run["e2e_s"]  # the package's own CPU seconds, to set beside the server's


def test_another_family_is_a_usage_error(tmp_path: Path):
    (tmp_path / "config.json").write_text('{"model_type": "qwen3_tts"}')
    args = argparse.Namespace(baseline="pocket-tts", hf_num_prompts=None, num_prompts=1)
    with pytest.raises(UsageError, match="Pocket TTS checkpoint"):
        _baseline(args, tmp_path, [], 1)
