"""Small layers built whole and as tensor-parallel shards, for the gloo tests (rank 0 in pytest, rank 1 in
``python -m tests.layers.tp_rank``): each case's full layer is drawn from a fixed seed on both ranks and each
rank's shard is cut from it by the layers' own ``tp_shards()``, as the checkpoint loader cuts them."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from omnistage.layers.attention.base import AttentionMetadata
from omnistage.layers.attention.context import ForwardContext, forward_context
from omnistage.layers.attention.torch_sdpa import TorchSDPABackend
from omnistage.layers.linear import GatedMLP
from omnistage.layers.moe import SparseMoeBlock
from omnistage.layers.parallel import UNSHARDED, TensorParallel
from omnistage.layers.rotary import Rotation
from omnistage.models.decoder import DecoderConfig, DecoderLayer, MoeConfig

HIDDEN = 32


def _decoder_cfg(kv_heads: int, shared: int = 0) -> DecoderConfig:
    return DecoderConfig(hidden_size=HIDDEN, num_layers=1, num_heads=4, num_kv_heads=kv_heads, head_dim=8,
                         intermediate_size=48, rms_norm_eps=1e-6, rope_theta=1e6, mrope_section=None,
                         moe=MoeConfig(8, 3, 24, norm_topk_prob=True, shared_expert_intermediate_size=shared),
                         sparse_layers=(True,))


# name -> layer factory taking the rank's TensorParallel
CASES: dict[str, Callable[[TensorParallel], nn.Module]] = {
    "gated_mlp": lambda tp: GatedMLP(HIDDEN, 48, tp=tp),
    "moe": lambda tp: SparseMoeBlock(HIDDEN, 8, 3, 24, True, shared_expert_intermediate_size=16, tp=tp),
    "layer_gqa": lambda tp: DecoderLayer(_decoder_cfg(kv_heads=2), 0, tp),
    "layer_kv_replicated": lambda tp: DecoderLayer(_decoder_cfg(kv_heads=1, shared=16), 0, tp),
}


def build(case: str, tp: TensorParallel = UNSHARDED) -> nn.Module:
    """The case's layer for ``tp``'s rank: drawn whole from seed 0, then cut to the rank's shards."""
    torch.manual_seed(0)
    full = CASES[case](UNSHARDED)
    with torch.no_grad():
        for p in full.parameters():
            p.normal_(0.0, 0.3)
    if not tp.sharded:
        return full.eval()
    shard = CASES[case](tp)
    cuts = {}
    for path, module in shard.named_modules():
        if getattr(module, "tp_shards", None) is not None:
            cuts.update({f"{path}.{name}" if path else name: spec for name, spec in module.tp_shards().items()})
    whole = dict(full.named_parameters())
    with torch.no_grad():
        for name, p in shard.named_parameters():
            p.copy_(cuts[name].take(whole[name]) if name in cuts else whole[name])
    return shard.eval()


def run(layer: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """One forward; decoder layers attend causally over the rows as one sequence (no cache)."""
    if not isinstance(layer, DecoderLayer):
        return layer(x)
    positions = torch.arange(x.shape[0])
    rotation = Rotation.of(*RotaryForTests(layer)(positions))
    meta = AttentionMetadata.for_fresh_sequences([x.shape[0]])
    with forward_context(ForwardContext(meta, TorchSDPABackend(), None)):
        return layer(x, rotation)


class RotaryForTests:
    def __init__(self, layer: DecoderLayer) -> None:
        from omnistage.layers.rotary import RotaryEmbedding

        self.rotary = RotaryEmbedding(layer.self_attn.head_dim, 1e6, None)

    def __call__(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.rotary(positions)
