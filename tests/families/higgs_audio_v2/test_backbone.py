"""The generator's step-path shortcuts against the plain arithmetic: the rotary table equals computing each
position alone (bit for bit: greedy codes rest on it), and stacked projections equal the separate ones."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from omnistage.families.higgs_audio_v2.backbone import Attention, Backbone, Mlp
from omnistage.families.higgs_audio_v2.config import HiggsCheckpoint
from omnistage.layers.rotary import rotate_half
from omnistage.models.sequence_cache import SequenceCache


def _config(higgs_tiny):
    return HiggsCheckpoint.from_folder(higgs_tiny).model


@torch.inference_mode()
def test_rotary_table_is_each_position_alone_across_growth(higgs_tiny):
    backbone = Backbone(_config(higgs_tiny))
    x = torch.randn(2, 1, 3, backbone.cfg.head_dim, generator=torch.Generator().manual_seed(0))
    for positions in (torch.tensor([[0, 1, 2], [5, 6, 7]]), torch.tensor([[300, 301, 302], [4000, 4001, 4002]])):
        cos, signed_sin = backbone.rotary(positions, int(positions.max()) + 1, torch.float32)
        angles = positions.float()[..., None] * backbone.inv_freq.float()
        angles = torch.cat((angles, angles), dim=-1)[:, None]
        expected = x * angles.cos() + rotate_half(x) * angles.sin()
        got = x * cos + x.roll(backbone.cfg.head_dim // 2, dims=-1) * signed_sin
        assert torch.equal(got, expected)
    assert backbone._table[0].shape[0] >= 4003


@torch.inference_mode()
def test_stacked_projections_equal_the_separate_ones(higgs_tiny):
    cfg = _config(higgs_tiny)
    torch.manual_seed(1)
    attention, mlp = Attention(cfg), Mlp(cfg)
    x = torch.randn(3, 1, cfg.hidden_size)
    separate = [torch.cat([attention.q_proj(x), attention.k_proj(x), attention.v_proj(x)], dim=-1),
                mlp.down_proj(F.silu(mlp.gate_proj(x)) * mlp.up_proj(x))]
    unfused = mlp(x)
    attention.fuse_()
    mlp.fuse_()
    assert attention.q_proj.weight.data_ptr() == attention.qkv.weight.data_ptr()  # a view: the weights held once
    assert mlp.up_proj.weight.data_ptr() == mlp.gate_up.weight[cfg.intermediate_size:].data_ptr()
    for got, expected in zip([attention.qkv(x), mlp(x)], separate):
        torch.testing.assert_close(got, expected, rtol=0, atol=1e-6)  # the same dot products; a gemm may block them
    torch.testing.assert_close(unfused, separate[1], rtol=0, atol=1e-6)


def test_greedy_codes_are_torch_argmax_with_ties_and_held_markers():
    from omnistage.families.higgs_audio_v2.runner import greedy_codes

    scores = torch.randn(3, 8, 1026, generator=torch.Generator().manual_seed(2))
    scores[0, 1, 5] = scores[0, 1, 900] = 50.0  # a tie: the first index wins, as torch's
    scores[1, 2] = float("-inf")
    scores[1, 2, 1024] = 0.0  # a held codebook: everything but its marker at -inf
    with torch.inference_mode():
        codes = greedy_codes(scores)
    assert codes.dtype == torch.long and torch.equal(codes, scores.argmax(dim=-1))
    assert int(codes[0, 1]) == 5 and int(codes[1, 2]) == 1024


@torch.inference_mode()
def test_an_all_text_or_all_audio_route_equals_the_mask(higgs_tiny):
    """A prompt without a voice skips the audio path's empty calls; the same positions through the mask agree."""
    cfg = _config(higgs_tiny)
    torch.manual_seed(2)
    backbone = Backbone(cfg)
    embeds = torch.randn(1, 7, cfg.hidden_size)
    for flag in (False, True):
        mask = torch.full((1, 7), flag)
        by_flag = backbone(embeds, flag, [SequenceCache()])
        by_mask = backbone(embeds, mask, [SequenceCache()])
        # the same rows through the same modules; the mask path only gathers and scatters them
        torch.testing.assert_close(by_flag, by_mask, rtol=1e-6, atol=1e-6)
    assert not torch.allclose(backbone(embeds, False, [SequenceCache()]), backbone(embeds, True, [SequenceCache()]))
