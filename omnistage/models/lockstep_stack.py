"""A dense decoder stack run for the lockstep predict loop without the per-layer module machinery.

A code predictor calls its small stack ``G - 1`` times per talker step (75 layer calls for Qwen3-Omni's 5 layers
and 16 codebooks), and at the batch sizes of serving each call is bound by Python and op dispatch, not by
arithmetic: module calls, the forward context, the stacked weights' staleness checks, the lockstep backend's cache
slicing and mask. This runs the same operations in the same order on the same tensors as
:meth:`omnistage.models.decoder.Decoder.run_layers` with :class:`LockstepBackend` (so its results are the same
bits), with what does not change between passes taken once: the weights once per predict call
(:meth:`LockstepStack.weights`), the cache views and the causal mask once per ``(N, step)`` by the caller.

It covers what code predictors are: dense layers, full attention, one rank. A stack that is not (a tensor-parallel
rank, whose leader must hand every forward to the other ranks; MoE or sliding-window layers) runs through the
decoder's own forward (:meth:`LockstepStack.supports`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NamedTuple

import torch

from omnistage.layers.attention.dense import LockstepViews, lockstep_attention
from omnistage.layers.linear import GatedMLP, StackedLinear, gated_mlp
from omnistage.layers.norm import rms_norm
from omnistage.layers.rotary import Rotation
from omnistage.models.decoder import Attention, Decoder, DecoderLayer


class _LayerWeights(NamedTuple):
    """One layer's tensors and constants, read from its modules once per predict call (a module attribute is a
    slow lookup, and the loop makes 75 layer calls a frame)."""

    input_norm: torch.Tensor
    post_norm: torch.Tensor
    head_norm: torch.Tensor
    qkv: StackedLinear
    o: StackedLinear
    gate_up: StackedLinear
    down: StackedLinear
    input_eps: float
    post_eps: float
    gate_up_sizes: list[int]
    act: Callable[[torch.Tensor], torch.Tensor]
    attention: Attention


class LockstepStack:
    def __init__(self, decoder: Decoder) -> None:
        if not self.supports(decoder):
            raise ValueError("the lockstep stack runs dense, full-attention, unsharded decoders only")
        self.decoder = decoder
        self.layers: list[DecoderLayer] = list(decoder.layers)  # type: ignore[arg-type]

    @staticmethod
    def supports(decoder: Decoder) -> bool:
        cfg = decoder.cfg
        return decoder.leader is None and decoder.tp.size == 1 and not any(cfg.sparse_layers) \
            and not any(w is not None for w in cfg.sliding_windows) \
            and all(isinstance(layer.mlp, GatedMLP) for layer in decoder.layers)

    def weights(self) -> list[_LayerWeights]:
        """Every layer's tensors as they are now: taken at the start of each predict call, so a weight replaced
        between calls (quantization, a move) is picked up, as the modules' own checks would."""
        out = []
        for layer in self.layers:
            attn, mlp = layer.self_attn, layer.mlp
            assert isinstance(mlp, GatedMLP)
            norm1, norm2 = layer.input_layernorm, layer.post_attention_layernorm
            out.append(_LayerWeights(norm1.weight, norm2.weight, attn.qk_norm.weight(), attn.qkv.stacked(),
                                     attn.o.stacked(), mlp.gate_up.stacked(), mlp.down.stacked(), norm1.eps,
                                     norm2.eps, mlp.gate_up.sizes, mlp.act, attn))
        return out

    def forward(self, x: torch.Tensor, rotation: Rotation, weights: Sequence[_LayerWeights],
                views: Sequence[LockstepViews]) -> torch.Tensor:
        """``x [N * new, H]`` -> the final normed hidden; ``views[i]``: layer i's cache for this pass."""
        for w, view in zip(weights, views):
            h = rms_norm(x, w.input_norm, w.input_eps)
            q, k, v = w.attention.rotated_qkv(w.qkv(h), w.head_norm, rotation)
            x = x + w.o(lockstep_attention(q, k, v, view, w.attention.scale).reshape(h.shape[0], -1))
            x = x + gated_mlp(rms_norm(x, w.post_norm, w.post_eps), w.gate_up, w.down, w.gate_up_sizes, w.act)
        return self.decoder.norm(x)
