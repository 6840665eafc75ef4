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
