"""The bytes a forward must read from memory, counted from the modules it actually calls.

Forward hooks (removed on exit) add, per module *call*:

* its own parameters once (linears, norms, the router, convolutions, layer scales): a module called
  15 times in a step (the code predictor's layers) reads its weights 15 times;
* for an embedding table, only the rows looked up;
* for the fused experts, the weights of the *distinct* experts its router selected in that call;
* for a paged attention layer, the keys and values of each sequence's context (clipped to the sliding
  window) from the forward context's metadata.

Activations are not counted: for decode they are a rounding error next to the weights; for a vocoder
(convolutions over audio samples) they are not, which its floor ratio then shows.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from omnistage.layers.attention.context import get_forward_context
from omnistage.layers.moe import FusedExperts


@dataclass
class ByteTally:
    weights: int = 0  # dense parameters: attention, norms, routers, heads, shared experts, convolutions
    experts: int = 0  # routed experts actually selected
    kv_cache: int = 0
    embedding_rows: int = 0
    active_experts: list[int] = field(default_factory=list)  # distinct experts per MoE call

    @property
    def total(self) -> int:
        return self.weights + self.experts + self.kv_cache + self.embedding_rows


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


class StepBytes:
    """``with StepBytes(model) as counter: ...``; ``counter.tally`` holds what the calls inside read."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self.tally = ByteTally()
        self._handles: list[torch.utils.hooks.RemovableHandle] = []

    def __enter__(self) -> StepBytes:
        for module in self.model.modules():
            hook = self._hook_for(module)
            if hook is not None:
                self._handles.append(module.register_forward_hook(hook))
        return self

    def __exit__(self, *exc: object) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    def _hook_for(self, module: nn.Module):  # noqa: ANN202 - a forward hook or None
        if isinstance(module, FusedExperts):
            return self._experts
        if isinstance(module, nn.Embedding):
            return self._embedding
        if hasattr(module, "layer_idx") and hasattr(module, "sliding_window"):  # a paged decoder attention
            return self._attention  # its projections and norms are submodules, counted on their own
        own = sum(_nbytes(p) for p in module.parameters(recurse=False))
        if own:
            return lambda _m, _args, _out: self._add_weights(own)
        return None

    def _add_weights(self, n: int) -> None:
        self.tally.weights += n

    def _experts(self, module: FusedExperts, args: tuple, _out: object) -> None:
        ids = args[1]
        active = int(torch.unique(ids).numel())
        per_expert = (_nbytes(module.gate_up_proj) + _nbytes(module.down_proj)) // module.num_experts
        self.tally.experts += active * per_expert
        self.tally.active_experts.append(active)

    def _embedding(self, module: nn.Embedding, args: tuple, _out: object) -> None:
        self.tally.embedding_rows += args[0].numel() * module.weight.shape[1] * module.weight.element_size()

    def _attention(self, module: nn.Module, _args: tuple, _out: object) -> None:
        ctx = get_forward_context()
        cache = ctx.kv_cache(module.layer_idx)
        if cache is None:
            return
        per_token = 2 * cache.shape[3] * cache.shape[4] * cache.element_size()  # key + value, all KV heads
        window = module.sliding_window
        tokens = sum(min(n, window) if window else n for n in ctx.meta.context_lens_cpu)
        self.tally.kv_cache += tokens * per_token
