"""The bytes a forward must read from memory, counted from the modules it actually calls.

Forward hooks (removed on exit) add, per module *call*:

* its own parameters once (linears, norms, the router, convolutions, layer scales): a module called
  15 times in a step (the code predictor's layers) reads its weights 15 times;
* the own parameters of each direct child it did *not* call during that call: the decoder layers use their
  projections and norms functionally (stacked q/k/v and gate/up matmuls, norms on the weights), so those weights
  are read by the parent's call without a call of their own;
* for an embedding table, only the rows looked up;
* for the fused experts, the weights of the *distinct* experts its router selected in that call;
* for a paged attention layer, the keys and values of each sequence's context (clipped to the sliding
  window) from the forward context's metadata;
* for a decoder run functionally by :class:`omnistage.models.lockstep_stack.LockstepStack` (a code predictor's
  passes: no layer module is called, only the decoder's final norm), all its layers' parameters once per call
  of that final norm made while the decoder itself is not running: one pass, one read of every layer.

Parameters are counted in their storage dtype: int8 weights one byte each (their per-row scales are buffers,
a rounding error beside them, and not counted).

Activations are not counted: for decode they are a rounding error next to the weights; for a vocoder
(convolutions over audio samples) they are not, which its floor ratio then shows.

Matmul FLOPs are counted beside the bytes (``2 x rows x weight elements`` for every matrix read, rows being the
tokens of the call that read it; ``2 x (token, expert) pairs x expert elements`` for the experts): at larger
batches a CPU decode step becomes bound by arithmetic, not by memory. Convolutions' FLOPs are not counted.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from omnistage.layers.attention.context import get_forward_context
from omnistage.layers.moe import FusedExperts
from omnistage.models.decoder import Decoder


@dataclass
class ByteTally:
    weights: int = 0  # dense parameters: attention, norms, routers, heads, shared experts, convolutions
    experts: int = 0  # routed experts actually selected
    kv_cache: int = 0
    embedding_rows: int = 0
    active_experts: list[int] = field(default_factory=list)  # distinct experts per MoE call
    matmul_flops: int = 0

    @property
    def total(self) -> int:
        return self.weights + self.experts + self.kv_cache + self.embedding_rows


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


@dataclass
class _Call:
    module: nn.Module
    called: set[int] = field(default_factory=set)  # ids of the modules called while this one ran


def _own_bytes(module: nn.Module) -> int:
    return sum(_nbytes(p) for p in module.parameters(recurse=False))


def _own_matrix_elements(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters(recurse=False) if p.dim() == 2)


def _rows(args: tuple) -> int:
    """Tokens of a call: the rows of its first tensor argument (``[..., features]``)."""
    x = args[0] if args and isinstance(args[0], torch.Tensor) else None
    return 0 if x is None or x.dim() == 0 else x.numel() // max(x.shape[-1], 1)


def _read_per_call(module: nn.Module) -> bool:
    """Embeddings (rows looked up) and fused experts (the selected ones) are counted by what a call selects, and
    never on behalf of a parent that did not call them."""
    return not isinstance(module, (FusedExperts, nn.Embedding))


class StepBytes:
    """``with StepBytes(model) as counter: ...``; ``counter.tally`` holds what the calls inside read."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self.tally = ByteTally()
        self._handles: list[torch.utils.hooks.RemovableHandle] = []
        self._calls: list[_Call] = []
        self._lockstep: dict[int, Decoder] = {}  # id(a decoder's final norm) -> that decoder

    def __enter__(self) -> StepBytes:
        self._calls.clear()
        self._lockstep = {id(m.norm): m for m in self.model.modules() if isinstance(m, Decoder)}
        for module in self.model.modules():
            self._handles.append(module.register_forward_pre_hook(self._enter))
            self._handles.append(module.register_forward_hook(self._leave))
        return self

    def __exit__(self, *exc: object) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    def _enter(self, module: nn.Module, _args: tuple) -> None:
        if self._calls:
            self._calls[-1].called.add(id(module))
        self._calls.append(_Call(module))

    def _leave(self, module: nn.Module, args: tuple, _out: object) -> None:
        call = self._calls.pop()
        if isinstance(module, FusedExperts):
            self._experts(module, args)
        elif isinstance(module, nn.Embedding):
            self._embedding(module, args)
        else:
            if hasattr(module, "layer_idx") and hasattr(module, "sliding_window"):  # a paged decoder attention
                self._attention(module)
            read = [module, *(child for child in module.children()
                              if id(child) not in call.called and _read_per_call(child))]
            self.tally.weights += sum(_own_bytes(m) for m in read)
            self.tally.matmul_flops += 2 * _rows(args) * sum(_own_matrix_elements(m) for m in read)
            self._lockstep_pass(module, args)

    def _lockstep_pass(self, module: nn.Module, args: tuple) -> None:
        """A decoder's final norm called outside the decoder's own forward ends a lockstep pass over its layers."""
        decoder = self._lockstep.get(id(module))
        if decoder is None or any(call.module is decoder for call in self._calls):
            return
        layers = list(decoder.layers.modules())
        self.tally.weights += sum(_own_bytes(m) for m in layers)
        self.tally.matmul_flops += 2 * _rows(args) * sum(_own_matrix_elements(m) for m in layers)

    def _experts(self, module: FusedExperts, args: tuple) -> None:
        ids = args[1]
        active = int(torch.unique(ids).numel())
        per_expert = (_nbytes(module.gate_up_proj) + _nbytes(module.down_proj)) // module.num_experts
        self.tally.experts += active * per_expert
        elements = (module.gate_up_proj.numel() + module.down_proj.numel()) // module.num_experts
        self.tally.matmul_flops += 2 * ids.numel() * elements
        self.tally.active_experts.append(active)

    def _embedding(self, module: nn.Embedding, args: tuple) -> None:
        self.tally.embedding_rows += args[0].numel() * module.weight.shape[1] * module.weight.element_size()

    def _attention(self, module: nn.Module) -> None:
        ctx = get_forward_context()
        cache = ctx.kv_cache(module.layer_idx)
        if cache is None:
            return
        per_token = 2 * cache.shape[3] * cache.shape[4] * cache.element_size()  # key + value, all KV heads
        window = module.sliding_window
        tokens = sum(min(n, window) if window else n for n in ctx.meta.context_lens_cpu)
        self.tally.kv_cache += tokens * per_token
