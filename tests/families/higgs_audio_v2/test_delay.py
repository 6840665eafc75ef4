"""The staircase: frames under Higgs's delay pattern, as transformers builds and reverts them, and the markers the
generation rule forces."""

from __future__ import annotations

import torch

from omnistage.engine.frame_chunker import Undelay
from omnistage.families.higgs_audio_v2.config import HiggsConfig
from omnistage.families.higgs_audio_v2.delay import DelayRule, delayed_voice, undelay

CFG = HiggsConfig(num_codebooks=4, codebook_size=18, audio_stream_bos_id=16, audio_stream_eos_id=17,
                  audio_token_id=100, audio_bos_token_id=101, audio_delay_token_id=102, eos_token_id=103)


def test_a_voice_is_laid_out_as_the_processor_builds_it():
    from transformers import HiggsAudioV2Processor

    codes = torch.arange(4 * 5).view(4, 5) % 16
    framed = torch.cat([torch.full((4, 1), 16), codes, torch.full((4, 1), 17)], dim=1)
    processor = HiggsAudioV2Processor.__new__(HiggsAudioV2Processor)
    processor.audio_stream_bos_id, processor.audio_stream_eos_id = 16, 17
    expected = processor.build_delay_pattern(framed[None])[0].T
    assert torch.equal(delayed_voice(codes, CFG), expected)
    assert delayed_voice(codes, CFG).shape == (5 + 2 + 3, 4)


def test_streamed_undelay_equals_the_whole_one():
    rows = torch.randint(0, 16, (20, 4), generator=torch.Generator().manual_seed(0))
    stream = Undelay(CFG.delays)
    parts = [stream.push(rows[a:b]) for a, b in ((0, 1), (1, 6), (6, 7), (7, 20))]
    assert torch.equal(torch.cat(parts), undelay(rows, CFG.delays))
    assert undelay(rows, CFG.delays)[0, 3] == rows[4, 3]  # codebook k of frame t is row t + k + 1


def test_markers_hold_each_codebook_in_turn():
    rule = DelayRule(CFG, torch.tensor([5, 6, 7, 8, 101]))
    frames = []
    for step in range(12):
        scores = torch.zeros(4, 18)
        scores[:, 3] = 1.0  # the model's own choice: code 3 everywhere
        if step == 5:
            scores[0, 17] = 2.0  # codebook 0 ends at step 5
        codes = rule.constrain(scores).argmax(-1)
        frames.append(codes)
        if rule.advance(bool((codes == 17).any()), bool((codes == 17).all())):
            break
    frames = torch.stack(frames)
    assert frames[0].tolist() == [16] * 4 and frames[1].tolist() == [3, 16, 16, 16]
    assert frames[3].tolist() == [3, 3, 3, 16] and frames[4].tolist() == [3, 3, 3, 3]
    assert frames[5].tolist() == [17, 3, 3, 3]  # then codebooks 0..k are held at EOS, one more each frame
    assert frames[6].tolist() == [17, 3, 3, 3] and frames[7].tolist() == [17, 17, 3, 3]
    assert frames[-1].tolist() == [17] * 4 and rule.last_id == CFG.eos_token_id and len(frames) == 10
