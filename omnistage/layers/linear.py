"""Feed-forward pieces made of plain linears: activations by config name and the gated MLP."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import torch
import torch.nn.functional as F
from torch import nn

# Config ``hidden_act`` names -> functions, matching transformers' ACT2FN for these names.
ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "silu": F.silu,
    "swish": F.silu,
    "gelu": F.gelu,
    "gelu_pytorch_tanh": partial(F.gelu, approximate="tanh"),
    "relu": F.relu,
}


def activation(name: str) -> Callable[[torch.Tensor], torch.Tensor]:
    try:
        return ACTIVATIONS[name]
    except KeyError:
        raise ValueError(f"unsupported activation {name!r}; known: {sorted(ACTIVATIONS)}") from None


class FusedRows:
    """Several linears over the same input as one matmul: their weights stacked row-wise in one tensor.

    The checkpoint's names stay (each linear keeps its own parameter, loaded as usual); on the first call the
    weights are copied into one stacked tensor and each parameter becomes a view of its rows, so the memory is
    the same. Anything that later replaces a parameter's storage (``.to()``, an assignment) is noticed by its
    data pointer and the stack is rebuilt; in-place loads (``copy_``) write into the stack through the views.
    One matmul instead of two or three matters at decode, where every step is launch- and call-bound.
    """

    def __init__(self, *linears: nn.Linear) -> None:
        self.linears = linears
        self.sizes = [linear.out_features for linear in linears]
        self._weight: torch.Tensor | None = None
        self._bias: torch.Tensor | None = None
        self._key: tuple[int, ...] = ()

    def _stack(self) -> None:
        with torch.inference_mode(False), torch.no_grad():
            weight = torch.cat([linear.weight.detach() for linear in self.linears])
            has_bias = self.linears[0].bias is not None
            bias = torch.cat([linear.bias.detach() for linear in self.linears]) if has_bias else None
            start = 0
            for linear, size in zip(self.linears, self.sizes):
                linear.weight.data = weight[start:start + size]
                if bias is not None:
                    linear.bias.data = bias[start:start + size]
                start += size
        self._weight, self._bias = weight, bias
        self._key = tuple(linear.weight.data_ptr() for linear in self.linears)

    def joint(self, x: torch.Tensor) -> torch.Tensor:
        """Every linear's output side by side, ``[..., sum(out_features)]``."""
        if self._key != tuple(linear.weight.data_ptr() for linear in self.linears):
            self._stack()
        return F.linear(x, self._weight, self._bias)

    def __call__(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return self.joint(x).split(self.sizes, dim=-1)


class GatedMLP(nn.Module):
    """``down(act(gate(x)) * up(x))``: the dense MLP of Qwen3 layers and the talker's shared expert.

    Parameter names (gate_proj/up_proj/down_proj) are the checkpoint's; gate and up run as one matmul.
    """

    def __init__(self, hidden_size: int, intermediate_size: int, hidden_act: str = "silu") -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.up_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=False)
        self.act = activation(hidden_act)
        self.gate_up = FusedRows(self.gate_proj, self.up_proj)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up(x)
        return F.linear(self.act(gate) * up, self.down_proj.weight)
