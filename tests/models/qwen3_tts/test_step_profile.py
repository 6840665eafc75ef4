"""Qwen3-TTS's talker replica measures its decode-step profile too, and leaves its engine empty."""

from __future__ import annotations

from pathlib import Path

from omnistage.config.pipeline import load_preset
from omnistage.families.qwen3_tts.family import PRESET as TTS_PRESET
from omnistage.families.qwen3_tts.workers import TalkerWorker
from omnistage.workers.base import WorkerSpec


def test_the_tts_talker_profiles_its_step(tts_dirs: dict[str, Path]) -> None:
    worker = TalkerWorker(WorkerSpec(str(tts_dirs["custom_voice"]), load_preset(TTS_PRESET).stage("talker")))
    free = worker.engine.scheduler.kv.num_free_blocks
    seconds = worker.step_profile()
    assert sorted(seconds) == [1, 2, 4, 8] and all(s > 0 for s in seconds.values())
    assert not worker.engine.has_unfinished_requests() and worker.engine.scheduler.kv.num_free_blocks == free
