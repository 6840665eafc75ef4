"""The codec stage's windows: the decoder is not causal, so a chunk decoded with ``PAST_FRAMES`` before and
``LOOKAHEAD_FRAMES`` after differs from the whole decode only by the receptive field's tail past the look-ahead
(bounded here, on three code sequences); with 10 frames on both sides it is the whole decode up to float rounding. torchaudio's resampling,
reproduced for the encoder, keeps a tone's level and length."""

from __future__ import annotations

import math

import pytest
import torch

from omnistage.families.higgs_audio_v2.checkpoint import load_codec
from omnistage.families.higgs_audio_v2.family import LOOKAHEAD_FRAMES, PAST_FRAMES
from omnistage.families.higgs_audio_v2.sinc_resample import sinc_resample
from omnistage.families.higgs_audio_v2.verify import streamed_decode


@pytest.fixture(scope="module")
def codec_and_whole(higgs_tiny):
    codec = load_codec(higgs_tiny)
    frames = torch.randint(0, 1024, (48, 8), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        return codec, frames, codec.decode(frames.T[None])[0]


@pytest.mark.parametrize("seed", [0, 1, 2])
@torch.inference_mode()
def test_served_windows_stay_within_their_bound(codec_and_whole, seed):
    codec = codec_and_whole[0]
    frames = torch.randint(0, 1024, (48, 8), generator=torch.Generator().manual_seed(seed))
    whole = codec.decode(frames.T[None])[0]
    streamed = streamed_decode(codec, frames, chunks=(1, 5, 9, 13), past=PAST_FRAMES, ahead=LOOKAHEAD_FRAMES)
    assert streamed.shape == whole.shape == (48 * 960,)
    torch.testing.assert_close(streamed, whole, rtol=0, atol=1e-3 * float(whole.abs().max()))


@torch.inference_mode()
def test_the_whole_receptive_field_is_the_whole_decode(codec_and_whole):
    codec, frames, whole = codec_and_whole
    torch.testing.assert_close(streamed_decode(codec, frames, chunks=(3, 7), past=10, ahead=10), whole,
                               rtol=0, atol=1e-6)


@torch.inference_mode()
def test_too_little_context_breaks_the_bound(codec_and_whole):
    """The bound above is not loose: two frames of context on each side leave seams far past it."""
    codec, frames, whole = codec_and_whole
    error = (streamed_decode(codec, frames, chunks=(3, 7), past=2, ahead=2) - whole).abs().max()
    assert error > 1e-3 * float(whole.abs().max())


def test_sinc_resampling_keeps_a_tone():
    t = torch.arange(24000, dtype=torch.float64) / 24000
    tone = torch.sin(2 * math.pi * 440 * t).float()
    out = sinc_resample(tone, 24000, 16000)
    assert out.shape == (16000,)
    expected = torch.sin(2 * math.pi * 440 * torch.arange(16000, dtype=torch.float64) / 16000).float()
    torch.testing.assert_close(out[200:-200], expected[200:-200], rtol=0, atol=2e-3)  # the filter's ripple
