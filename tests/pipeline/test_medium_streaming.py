"""On the medium checkpoint (the real codec layout: 16 code groups, 2048 codes, real upsampling), a streamed
answer's audio equals the same answer consumed whole, although their code2wav chunks are cut elsewhere."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from omnistage.pipeline.omni import Omni
from omnistage.pipeline.runtime import PipelineOptions
from tests.pipeline.specs import small_dict, write_spec

PROMPT = "Say something short."
FRAMES = 20


def test_streamed_audio_equals_the_whole_answer_on_the_medium_checkpoint(medium_dir: Path, tmp_path: Path) -> None:
    data = small_dict(talker_frames=FRAMES)
    data["stages"][1]["sampling"]["temperature"] = 0.0  # greedy codes: both answers are the same frames
    options = PipelineOptions(in_process=True, talker_min_new_tokens=FRAMES)
    greedy = dict(max_tokens=12, temperature=0.0)
    with Omni(medium_dir, write_spec(tmp_path, data), options=options) as omni:
        streamed = list(omni.generate(PROMPT, ["text", "audio"], stream=True, initial_codec_chunk_frames=3, **greedy))
        (whole,) = omni.generate(PROMPT, ["text", "audio"], stream=False, initial_codec_chunk_frames=5, **greedy)
    pieces = [o.audio for o in streamed if o.audio is not None]
    assert len(pieces) >= 3 and pieces[0].shape[0] == 3 * 1920 - 555  # a 3-frame first chunk, then others
    audio = np.concatenate(pieces)
    assert whole.audio is not None and whole.audio.shape == audio.shape == ((FRAMES - 1) * 1920 - 555,)
    # Other chunk boundaries, so other matmul shapes: equal to rounding (a boundary artifact would be ~1e-2).
    np.testing.assert_allclose(audio, whole.audio, atol=1e-5, rtol=1e-4)
    assert float(np.abs(audio).max()) > 1e-3  # real signal, not silence that any pair would match
