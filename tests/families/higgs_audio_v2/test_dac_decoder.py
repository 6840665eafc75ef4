"""The decoder's swapped modules (Snake and small convs in dac_kernels.c, else numpy's ``sin`` and shifted sums;
the other convs as one matrix product) against transformers' own ``Snake1d``/``Conv1d``/``ConvTranspose1d``, on
the tiny tokenizer's weights: within float rounding of the signal. Each module's torch path runs under autograd
(where the C kernels step aside)."""

from __future__ import annotations

import shutil

import pytest
import torch
from torch import nn

from omnistage.families.higgs_audio_v2 import dac_native
from omnistage.families.higgs_audio_v2.checkpoint import load_codec
from omnistage.families.higgs_audio_v2.dac_decoder import (
    GemmConv1d,
    MonoConv1d,
    PolyphaseConvTranspose1d,
    ResidualUnit,
    Snake,
    adjust_dac_decoder,
)
from omnistage.layers.snake import sin_squared_


@pytest.fixture(scope="module")
def codec(higgs_tiny):
    return load_codec(higgs_tiny)


def _transformers_decoder(codec) -> nn.Module:
    """The same decoder with transformers' modules and the loaded weights (output padding and no tanh kept)."""
    from transformers import DacModel

    plain = DacModel(codec.config.acoustic_model_config).decoder
    for module in plain.modules():
        if isinstance(module, nn.ConvTranspose1d):
            module.output_padding = (module.stride[0] % 2,)
    plain.tanh = nn.Identity()
    plain.load_state_dict(codec.acoustic_decoder.state_dict())
    return plain.eval()


def test_the_swapped_modules_are_in_place(codec):
    modules = list(codec.acoustic_decoder.modules())
    for kind in (ResidualUnit, Snake, MonoConv1d, GemmConv1d, PolyphaseConvTranspose1d):
        assert any(isinstance(m, kind) for m in modules), kind
    assert not any(type(m) in (nn.Conv1d, nn.ConvTranspose1d) or type(m).__name__ == "Snake1d" for m in modules)


@torch.inference_mode()
def test_decoder_equals_transformers(codec):
    hidden = torch.randn(3, codec.config.acoustic_model_config.hidden_size, 20,
                         generator=torch.Generator().manual_seed(1))
    ours, theirs = codec.acoustic_decoder(hidden), _transformers_decoder(codec)(hidden)
    assert ours.shape == theirs.shape == (3, 1, 20 * codec.hop)
    # float rounding only: numpy's sin is within an ulp of torch's, and a shifted sum adds the taps in its order
    torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-5 * float(theirs.abs().max()))


def _both_paths(module: nn.Module, x: torch.Tensor) -> list[torch.Tensor]:
    """The module's output outside autograd (C kernel where it applies) and under it (torch's ops)."""
    with torch.inference_mode():
        fast = module(x)
    return [fast, module(x.clone().requires_grad_()).detach()]


@pytest.mark.parametrize("kernel,dilation", [(7, 1), (7, 9), (1, 1)])
def test_mono_conv_equals_conv1d(kernel, dilation):
    conv = nn.Conv1d(1, 1, kernel, dilation=dilation, padding=dilation * (kernel - 1) // 2)
    mono = MonoConv1d(1, 1, kernel, dilation=dilation, padding=dilation * (kernel - 1) // 2)
    mono.load_state_dict(conv.state_dict())
    x = torch.randn(2, 1, 300, generator=torch.Generator().manual_seed(2))
    for out in _both_paths(mono, x):
        torch.testing.assert_close(out, conv(x).detach(), rtol=0, atol=1e-6)


def test_snake_equals_transformers_at_large_arguments():
    """The C kernel's own sin, reduced by pi: within 1e-6 of the signal at |alpha x| up to ~100."""
    from transformers.models.dac.modeling_dac import Snake1d

    theirs, ours = Snake1d(5), Snake(5)
    with torch.no_grad():
        theirs.alpha.copy_(torch.tensor([0.05, 0.5, 1.0, 2.0, 7.0]).reshape(1, 5, 1))
    ours.load_state_dict(theirs.state_dict())
    x = torch.linspace(-15, 15, 4001).repeat(2, 5, 1)
    for out in _both_paths(ours, x):
        torch.testing.assert_close(out, theirs(x).detach(), rtol=0, atol=1e-6 * 15)


def test_sin_squared_in_place_and_under_autograd():
    x = torch.linspace(-20, 20, 1001)
    expected = x.sin().square()
    out = sin_squared_(x.clone())
    torch.testing.assert_close(out, expected, rtol=0, atol=1e-6)
    leaf = torch.linspace(-3, 3, 11, requires_grad=True)
    sin_squared_(leaf * 1.0).sum().backward()  # autograd's path: torch's own ops
    torch.testing.assert_close(leaf.grad, torch.sin(2 * leaf.detach()), rtol=0, atol=1e-6)


@pytest.mark.parametrize("channels,kernel,dilation,batch", [(16, 7, 1, 1), (4, 7, 9, 3), (8, 1, 1, 2), (3, 7, 3, 1)])
def test_gemm_conv_equals_conv1d(channels, kernel, dilation, batch):
    conv = nn.Conv1d(channels, channels + 1, kernel, dilation=dilation, padding=dilation * (kernel - 1) // 2)
    gemm = GemmConv1d(channels, channels + 1, kernel, dilation=dilation, padding=dilation * (kernel - 1) // 2)
    gemm.load_state_dict(conv.state_dict())
    x = torch.randn(batch, channels, 37, generator=torch.Generator().manual_seed(3))
    for out in _both_paths(gemm, x):
        torch.testing.assert_close(out, conv(x).detach(), rtol=0, atol=1e-5)


@pytest.mark.parametrize("channels,dilation,batch", [(1, 1, 2), (2, 3, 1), (8, 9, 2), (16, 1, 1)])
def test_residual_unit_equals_transformers(channels, dilation, batch):
    """One pass of dac_kernels.c (up to 8 channels; across blocks of 512 samples) or the swapped modules."""
    from transformers.models.dac.modeling_dac import DacResidualUnit

    torch.manual_seed(channels)
    theirs = DacResidualUnit(channels, dilation)
    with torch.no_grad():
        for snake in (theirs.snake1, theirs.snake2):
            snake.alpha.uniform_(0.3, 3.0)
    decoder = nn.Sequential(DacResidualUnit(channels, dilation))
    adjust_dac_decoder(decoder)
    decoder.load_state_dict(nn.Sequential(theirs).state_dict())
    assert isinstance(decoder[0], ResidualUnit)
    x = torch.randn(batch, channels, 1300, generator=torch.Generator().manual_seed(4)) * 3
    expected = theirs(x).detach()
    for out in _both_paths(decoder[0], x):
        torch.testing.assert_close(out, expected, rtol=0, atol=1e-5 * float(expected.abs().max()))


@pytest.mark.skipif(shutil.which("cc") is None and shutil.which("gcc") is None and shutil.which("clang") is None,
                    reason="no C compiler: the decoder runs its torch paths (tested above under autograd)")
def test_the_kernels_build_here():
    """The served path is the C one (a machine with a compiler): a silent fallback would pass every test above."""
    x = torch.randn(1, 2, 10)
    with torch.inference_mode():
        assert dac_native.snake(x, torch.ones(1, 2, 1)) is not None
        assert dac_native.conv1d(x, torch.ones(2, 2, 3), None, 1, 1) is not None
        conv1, conv2 = nn.Conv1d(2, 2, 3, padding=1), nn.Conv1d(2, 2, 1)
        assert dac_native.residual_unit(x, torch.ones(1, 2, 1), conv1, torch.ones(1, 2, 1), conv2) is not None
        assert dac_native.conv_transpose(x, torch.ones(2, 1, 4), None, 2) is not None


@pytest.mark.parametrize("stride", [2, 3, 4, 5, 8])
@pytest.mark.parametrize("batch,length", [(1, 1), (1, 13), (3, 6)])
def test_polyphase_equals_conv_transpose(stride, batch, length):
    """DAC's upsampling shape (kernel 2s, padding ceil(s/2), output padding s % 2), odd and even strides."""
    shape = dict(kernel_size=2 * stride, stride=stride, padding=(stride + 1) // 2, output_padding=stride % 2)
    conv = nn.ConvTranspose1d(6, 3, **shape)
    poly = PolyphaseConvTranspose1d(6, 3, **shape)
    poly.load_state_dict(conv.state_dict())
    x = torch.randn(batch, 6, length, generator=torch.Generator().manual_seed(stride))
    for ours in _both_paths(poly, x):  # dac_kernels.c (6 channels), and the matrix product
        assert ours.shape == (batch, 3, length * stride)
        torch.testing.assert_close(ours, conv(x).detach(), rtol=0, atol=1e-5)


def test_the_swap_keeps_the_parameters_and_draws_nothing(codec):
    """make-tiny saves what the adjusted decoder holds: a swapped conv keeps transformers' drawn weights, and the
    global generator is where it was, so the codec's later modules draw what they drew before the swap (at this
    width no conv has 1 channel: MonoConv1d, which draws its own, is not used)."""
    from transformers import DacConfig, DacModel

    config = DacConfig(**{**codec.config.acoustic_model_config.to_dict(), "decoder_hidden_size": 64})
    decoder = DacModel(config).decoder
    before = {name: p.detach().clone() for name, p in decoder.named_parameters()}
    state = torch.get_rng_state()
    adjust_dac_decoder(decoder)
    assert torch.equal(torch.get_rng_state(), state)
    assert isinstance(decoder.block[0].conv_t1, PolyphaseConvTranspose1d) and isinstance(decoder.conv2, GemmConv1d)
    after = dict(decoder.named_parameters())
    assert before.keys() == after.keys()
    for name, value in before.items():
        assert torch.equal(after[name], value), name
