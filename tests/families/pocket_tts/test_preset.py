"""Pocket TTS's preset as the orchestrator reads it: a stream's first chunk stays short while other streams play
(at 25 frames of ``codec_chunk_frames``, a 2 s utterance at c=4 came whole, its first audio at its end)."""

from __future__ import annotations

from omnistage.config.pipeline import load_preset
from omnistage.engine.generation_engine import vocoder_batch_cap
from omnistage.families.pocket_tts.family import PRESET
from omnistage.pipeline.codec_edge import initial_chunk_frames

FRAME_S = 0.08  # 12.5 Hz


def test_the_first_chunk_stays_short_under_load():
    spec = load_preset(PRESET)
    decoder = spec.stage("decoder")
    capacity = vocoder_batch_cap(decoder.engine, "cpu") * decoder.replicas
    alone = initial_chunk_frames(spec.streaming, None, 0, capacity)
    assert alone * FRAME_S <= 0.16  # c=1: two frames
    for busy in (3, 7, 31):  # c=4, c=8, a full backbone
        first = initial_chunk_frames(spec.streaming, None, busy, capacity)
        assert alone <= first and first * FRAME_S <= 0.64, (busy, first)


def test_stages_keep_one_thread_each():
    """Two stages on a 2-core machine: each a core, as the reference runtime's generator and decoder threads."""
    assert [s.threads for s in load_preset(PRESET).stages] == [1, 1]
