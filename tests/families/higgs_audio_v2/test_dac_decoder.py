"""The decoder's swapped modules (numpy's ``sin`` in Snake, 1-channel convs as shifted sums) against transformers'
own ``Snake1d``/``Conv1d``, on the tiny tokenizer's weights: within float rounding of the signal."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from omnistage.families.higgs_audio_v2.checkpoint import load_codec
from omnistage.families.higgs_audio_v2.dac_decoder import MonoConv1d, Snake
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
    assert any(isinstance(m, Snake) for m in modules) and any(isinstance(m, MonoConv1d) for m in modules)
    assert not any(type(m).__name__ == "Snake1d" for m in modules)


@torch.inference_mode()
def test_decoder_equals_transformers(codec):
    hidden = torch.randn(3, codec.config.acoustic_model_config.hidden_size, 20,
                         generator=torch.Generator().manual_seed(1))
    ours, theirs = codec.acoustic_decoder(hidden), _transformers_decoder(codec)(hidden)
    assert ours.shape == theirs.shape == (3, 1, 20 * codec.hop)
    # float rounding only: numpy's sin is within an ulp of torch's, and a shifted sum adds the taps in its order
    torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-5 * float(theirs.abs().max()))


@pytest.mark.parametrize("kernel,dilation", [(7, 1), (7, 9), (1, 1)])
def test_mono_conv_equals_conv1d(kernel, dilation):
    conv = nn.Conv1d(1, 1, kernel, dilation=dilation, padding=dilation * (kernel - 1) // 2)
    mono = MonoConv1d(1, 1, kernel, dilation=dilation, padding=dilation * (kernel - 1) // 2)
    mono.load_state_dict(conv.state_dict())
    x = torch.randn(2, 1, 300, generator=torch.Generator().manual_seed(2))
    with torch.inference_mode():
        torch.testing.assert_close(mono(x), conv(x), rtol=0, atol=1e-6)


def test_sin_squared_in_place_and_under_autograd():
    x = torch.linspace(-20, 20, 1001)
    expected = x.sin().square()
    out = sin_squared_(x.clone())
    torch.testing.assert_close(out, expected, rtol=0, atol=1e-6)
    leaf = torch.linspace(-3, 3, 11, requires_grad=True)
    sin_squared_(leaf * 1.0).sum().backward()  # autograd's path: torch's own ops
    torch.testing.assert_close(leaf.grad, torch.sin(2 * leaf.detach()), rtol=0, atol=1e-6)
