"""Feed-forward pieces made of plain linears: activations by config name and the gated MLP."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from omnistage.layers.parallel import UNSHARDED, ShardSpec, TensorParallel
from omnistage.layers.quant.matmul import quantized_linear
from omnistage.layers.quant.w8a8 import FLAG as W8A8_FLAG

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


class StackedLinear(NamedTuple):
    """One matmul's tensors: ``weight [N, K]`` (a 1-byte weight with its per-row ``scale [N]`` when quantized;
    ``dynamic_inputs``: W8A8 where it is faster, :mod:`omnistage.layers.quant.w8a8`)."""

    weight: torch.Tensor
    bias: torch.Tensor | None
    scale: torch.Tensor | None
    dynamic_inputs: bool = False

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.scale is None:
            return F.linear(x, self.weight, self.bias)
        return quantized_linear(x, self.weight, self.scale, self.bias, self.dynamic_inputs)


def gated_mlp(x: torch.Tensor, gate_up: StackedLinear, down: StackedLinear, sizes: list[int],
              act: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """``down(act(gate(x)) * up(x))`` with gate and up as one matmul (``sizes``: their widths)."""
    gate, up = gate_up(x).split(sizes, dim=-1)
    return down(act(gate) * up)


class FusedRows:
    """Several linears over the same input as one matmul: their weights stacked row-wise in one tensor.

    The checkpoint's names stay (each linear keeps its own parameter, loaded as usual); on the first call the
    weights are copied into one stacked tensor and each parameter becomes a view of its rows, so the memory is
    the same. Anything that later replaces a parameter's storage (``.to()``, an assignment, quantization) is
    noticed by its data pointer and the stack is rebuilt; in-place loads (``copy_``) write into the stack through
    the views. One matmul instead of two or three matters at decode, where every step is launch- and call-bound.
    Quantized linears (a 1-byte ``weight`` and a per-row ``weight_scale``, :mod:`omnistage.layers.quant`) stack
    their scales the same way. ``use_bias=False`` leaves the biases out (a row-parallel linear adds its bias on
    one rank only, after the all-reduce would add it N times).
    """

    def __init__(self, *linears: nn.Linear, use_bias: bool = True) -> None:
        self.linears = linears
        self.sizes = [linear.out_features for linear in linears]
        self.use_bias = use_bias
        self._weight: torch.Tensor | None = None
        self._bias: torch.Tensor | None = None
        self._scale: torch.Tensor | None = None
        self._dynamic_inputs = False
        self._key: tuple[int, ...] = ()

    def _storage_key(self) -> tuple[int, ...]:
        # On every call (decode is call-bound): quantizing replaces a weight's storage, so the weights' pointers
        # notice it; the scales are looked at only once the stack holds some.
        key = tuple(linear.weight.data_ptr() for linear in self.linears)
        if self._scale is None:
            return key
        # A quantized stack also restacks when its linears are marked for W8A8 after it was built.
        return key + tuple(linear.weight_scale.data_ptr() for linear in self.linears) \
            + (getattr(self.linears[0], W8A8_FLAG, False),)

    def _stack(self) -> None:
        with torch.inference_mode(False), torch.no_grad():
            self._weight = self._stack_attr("weight")
            has_bias = self.use_bias and self.linears[0].bias is not None
            self._bias = self._stack_attr("bias") if has_bias else None
            quantized = getattr(self.linears[0], "weight_scale", None) is not None
            self._scale = self._stack_attr("weight_scale") if quantized else None
            self._dynamic_inputs = quantized and getattr(self.linears[0], W8A8_FLAG, False)
        self._key = self._storage_key()

    def _stack_attr(self, name: str) -> torch.Tensor:
        """One tensor of every linear's ``name`` rows; each linear's attribute becomes a view of its rows."""
        stacked = torch.cat([getattr(linear, name).detach() for linear in self.linears])
        start = 0
        for linear, size in zip(self.linears, self.sizes):
            getattr(linear, name).data = stacked[start:start + size]
            start += size
        return stacked

    def stacked(self) -> StackedLinear:
        """The stacked tensors as they are now (restacked if a weight's storage changed): what a loop that runs
        the same weights many times holds on to, checking staleness once instead of every call."""
        if self._key != self._storage_key():
            self._stack()
        assert self._weight is not None
        return StackedLinear(self._weight, self._bias, self._scale, self._dynamic_inputs)

    def joint(self, x: torch.Tensor) -> torch.Tensor:
        """Every linear's output side by side, ``[..., sum(out_features)]``."""
        return self.stacked()(x)

    def __call__(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        out = self.joint(x)
        return (out,) if len(self.sizes) == 1 else out.split(self.sizes, dim=-1)


class ResizeMLP(nn.Module):
    """One width to another, ``fc2(act(fc1(x)))`` with biases (the checkpoints' ``linear_fc1``/``linear_fc2``): the
    talkers' projections of thinker states or text embeddings to their own width."""

    def __init__(self, in_size: int, intermediate_size: int, out_size: int, hidden_act: str) -> None:
        super().__init__()
        self.linear_fc1 = nn.Linear(in_size, intermediate_size, bias=True)
        self.linear_fc2 = nn.Linear(intermediate_size, out_size, bias=True)
        self.act = activation(hidden_act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear_fc2(self.act(self.linear_fc1(x)))


class GatedMLP(nn.Module):
    """``down(act(gate(x)) * up(x))``: the dense MLP of Qwen3 layers and the talker's shared expert.

    Parameter names (gate_proj/up_proj/down_proj) are the checkpoint's; gate and up run as one matmul. Under
    tensor parallelism gate/up are column parallel and down row parallel over the intermediate dimension:
    :meth:`partial` is this rank's share of the output, :meth:`forward` the all-reduced sum.
    """

    def __init__(self, hidden_size: int, intermediate_size: int, hidden_act: str = "silu",
                 tp: TensorParallel = UNSHARDED) -> None:
        super().__init__()
        self.tp = tp
        local = tp.split(intermediate_size, "intermediate_size")
        self.gate_proj = nn.Linear(hidden_size, local, bias=False)
        self.up_proj = nn.Linear(hidden_size, local, bias=False)
        self.down_proj = nn.Linear(local, hidden_size, bias=False)
        self.act = activation(hidden_act)
        self.gate_up = FusedRows(self.gate_proj, self.up_proj)
        self.down = FusedRows(self.down_proj)

    def partial(self, x: torch.Tensor) -> torch.Tensor:
        return gated_mlp(x, self.gate_up.stacked(), self.down.stacked(), self.gate_up.sizes, self.act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.tp.all_reduce(self.partial(x))

    def quantizable_linears(self) -> list[nn.Linear]:
        return [self.gate_proj, self.up_proj, self.down_proj]

    def tp_shards(self) -> dict[str, ShardSpec]:
        col, row = self.tp.columns(), self.tp.rows()
        return {"gate_proj.weight": col, "up_proj.weight": col, "down_proj.weight": row}
