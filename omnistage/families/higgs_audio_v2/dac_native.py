"""``dac_kernels.c`` from Python: the DAC decoder's Snake and small-channel convolutions in one pass each.

Each function takes CPU float32 tensors outside autograd and returns a new tensor, or None where the kernel does
not apply (another device or dtype, autograd on) or could not be built: the caller then runs its torch ops.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import torch

from omnistage.native_library import NativeLibrary


def _bind(lib: ctypes.CDLL) -> None:
    ptr, long = ctypes.c_void_p, ctypes.c_long
    lib.dac_snake.argtypes = (ptr, ptr, ptr, long, long, long)
    lib.dac_snake.restype = None
    lib.dac_conv1d.argtypes = (ptr, ptr, ptr, ptr, long, long, long, long, long, long, long)
    lib.dac_conv1d.restype = None
    lib.dac_residual_unit.argtypes = (ptr, ptr, ptr, ptr, ptr, long, ptr, ptr, ptr, long, long, long, long)
    lib.dac_residual_unit.restype = ctypes.c_int
    lib.dac_conv_transpose.argtypes = (ptr, ptr, ptr, ptr, long, long, long, long, long)
    lib.dac_conv_transpose.restype = None


_LIBRARY = NativeLibrary(Path(__file__).with_name("dac_kernels.c"), ("-O3", "-march=native", "-fPIC"), _bind,
                         "the DAC decoder's Snake and small convolutions run on torch ops")


def _usable(*tensors: torch.Tensor) -> ctypes.CDLL | None:
    if any(t.device.type != "cpu" or t.dtype != torch.float32 for t in tensors):
        return None
    if torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
        return None  # autograd would need torch's ops
    return _LIBRARY.load()


def snake(x: torch.Tensor, alpha: torch.Tensor) -> torch.Tensor | None:
    """``x + sin(alpha x)^2 / (alpha + 1e-9)`` for ``x`` ``[B, C, T]``, ``alpha`` ``[1, C, 1]``."""
    lib = _usable(x, alpha)
    if lib is None or x.dim() != 3:
        return None
    x, alpha = x.contiguous(), alpha.detach().contiguous()
    out = torch.empty_like(x)
    lib.dac_snake(out.data_ptr(), x.data_ptr(), alpha.data_ptr(), *x.shape)
    return out


def conv1d(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, dilation: int,
           pad: int) -> torch.Tensor | None:
    """A stride-1 ``Conv1d`` keeping the length (``2 pad == dilation (K - 1)``) of ``x`` ``[B, C, T]``."""
    lib = _usable(x, weight) if bias is None else _usable(x, weight, bias)
    out_ch, in_ch, kernel = weight.shape
    if lib is None or x.dim() != 3 or x.shape[1] != in_ch or 2 * pad != dilation * (kernel - 1):
        return None
    x, weight = x.contiguous(), weight.detach().contiguous()
    bias = None if bias is None else bias.detach().contiguous()
    out = x.new_empty(x.shape[0], out_ch, x.shape[2])
    lib.dac_conv1d(out.data_ptr(), x.data_ptr(), weight.data_ptr(), None if bias is None else bias.data_ptr(),
                   x.shape[0], in_ch, out_ch, x.shape[2], kernel, dilation, pad)
    return out


def residual_unit(x: torch.Tensor, alpha1: torch.Tensor, conv1: torch.nn.Conv1d, alpha2: torch.Tensor,
                  conv2: torch.nn.Conv1d) -> torch.Tensor | None:
    """DAC's ``x + conv2(snake2(conv1(snake1(x))))`` for ``x`` ``[B, C, T]``: ``conv1`` ``C -> C`` keeping the
    length (stride 1), ``conv2`` ``C -> C`` of kernel 1, both with biases."""
    lib = _usable(x, alpha1, alpha2, conv1.weight, conv2.weight)
    channels, kernel, dilation = conv1.in_channels, conv1.kernel_size[0], conv1.dilation[0]
    if (lib is None or x.dim() != 3 or x.shape[1] != channels or conv1.bias is None or conv2.bias is None
            or conv1.out_channels != channels or conv2.in_channels != channels or conv2.out_channels != channels
            or conv2.kernel_size[0] != 1 or conv1.stride[0] != 1 or conv1.groups != 1 or conv2.groups != 1
            or isinstance(conv1.padding, str) or 2 * conv1.padding[0] != dilation * (kernel - 1)):
        return None
    x = x.contiguous()
    params = [t.detach().contiguous() for t in (alpha1, conv1.weight, conv1.bias, alpha2, conv2.weight, conv2.bias)]
    out = torch.empty_like(x)
    a1, w1, b1, a2, w2, b2 = (t.data_ptr() for t in params)
    if lib.dac_residual_unit(out.data_ptr(), x.data_ptr(), a1, w1, b1, dilation, a2, w2, b2, x.shape[0], channels,
                             x.shape[2], kernel) != 0:
        return None
    return out


def conv_transpose(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                   stride: int) -> torch.Tensor | None:
    """DAC's upsampling ``ConvTranspose1d`` (kernel ``2 stride``, padding ``ceil(stride / 2)``, output padding
    ``stride % 2``) of ``x`` ``[B, C, T]`` -> ``[B, O, T stride]``; ``weight`` ``[C, O, 2 stride]``."""
    lib = _usable(x, weight) if bias is None else _usable(x, weight, bias)
    in_ch, out_ch, kernel = weight.shape
    if lib is None or x.dim() != 3 or x.shape[1] != in_ch or kernel != 2 * stride or stride > 16:
        return None
    x, weight = x.contiguous(), weight.detach().contiguous()
    bias = None if bias is None else bias.detach().contiguous()
    out = x.new_empty(x.shape[0], out_ch, x.shape[2] * stride)
    lib.dac_conv_transpose(out.data_ptr(), x.data_ptr(), weight.data_ptr(), None if bias is None else bias.data_ptr(),
                           x.shape[0], in_ch, out_ch, x.shape[2], stride)
    return out
