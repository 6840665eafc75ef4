"""``bench serve --backend openai-audio-speech --baseline hf`` on Higgs Audio v2 runs transformers' ``generate``
through the family's ``speech_baseline`` hook (not Qwen3-TTS's sequential path), one utterance at a time."""

from __future__ import annotations

import pytest

from omnistage.tools.bench.speech import run_family_baseline, speech_prompts


def test_the_hf_baseline_is_transformers_generate(higgs_tiny):
    figures = run_family_baseline(higgs_tiny, speech_prompts(2, 4, seed=0), audio_frames=20)
    assert figures is not None and figures["completed"] == 2
    # 21 rows a request, 8 of them the staircase's: 13 frames of 40 ms (a random tiny never says EOS)
    assert figures["mean_audio_s"] == pytest.approx(13 * 0.04)
    assert figures["audio_throughput"] > 0
