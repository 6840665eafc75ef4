"""The MoE expert paths: the torch path and the fused Triton kernel (interpreted on CPU) against the definition."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from omnistage.layers.moe_torch import experts_sorted
from tests.layers.moe_reference import experts_reference, random_experts, random_routing

# Different summation orders (per-expert matmuls vs per-token vectors): fp32 rounding only.
FP32 = dict(atol=1e-5, rtol=1e-4)

# (tokens, experts, top_k, crowd): decode batches, a prefill-sized batch, many tokens on few experts.
SHAPES = [(1, 16, 4, None), (5, 16, 4, None), (16, 64, 8, None), (40, 16, 2, None), (24, 32, 4, 5)]


@pytest.mark.parametrize(("tokens", "experts", "top_k", "crowd"), SHAPES)
def test_sorted_matches_reference(tokens: int, experts: int, top_k: int, crowd: int | None) -> None:
    gate_up, down = random_experts(experts, 32, 24, seed=tokens)
    x = torch.randn(tokens, 32)
    ids, weights = random_routing(tokens, experts, top_k, seed=tokens, crowd=crowd)
    got = experts_sorted(x, ids, weights, gate_up, down, F.silu)
    torch.testing.assert_close(got, experts_reference(x, ids, weights, gate_up, down), **FP32)


class _WeightUse(TorchDispatchMode):
    """Records every op that receives a tensor sharing storage with one of the watched weights."""

    def __init__(self, *weights: torch.Tensor) -> None:
        super().__init__()
        self.storages = [w.untyped_storage().data_ptr() for w in weights]
        self.ops: list[tuple[str, int, int]] = []  # (op name, which weight, element offset of the view)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        for arg in [*args, *(kwargs or {}).values()]:
            if isinstance(arg, torch.Tensor) and arg.untyped_storage().data_ptr() in self.storages:
                which = self.storages.index(arg.untyped_storage().data_ptr())
                self.ops.append((func.overloadpacket.__name__, which, arg.storage_offset()))
        return func(*args, **(kwargs or {}))


def test_sorted_reads_each_active_expert_once_and_copies_nothing() -> None:
    gate_up, down = random_experts(16, 32, 24)
    x = torch.randn(9, 32)
    ids, weights = random_routing(9, 16, 4, seed=3)
    with _WeightUse(gate_up, down) as use:
        experts_sorted(x, ids, weights, gate_up, down, F.silu)
    assert {name for name, _, _ in use.ops} <= {"select", "t", "transpose", "mm"}, use.ops  # no gather or copy
    active = sorted(set(ids.flatten().tolist()))
    for which, weight in enumerate((gate_up, down)):
        per_expert = weight[0].numel()
        matmuls = [offset // per_expert for name, w, offset in use.ops if name == "mm" and w == which]
        assert matmuls == active  # one matmul per active expert, in expert order, none for idle experts


def test_layer_dispatch_is_the_torch_path_on_cpu() -> None:
    from omnistage.layers.moe import FusedExperts

    layer = FusedExperts(8, 32, 24)
    gate_up, down = random_experts(8, 32, 24)
    with torch.no_grad():
        layer.gate_up_proj.copy_(gate_up)
        layer.down_proj.copy_(down)
        x = torch.randn(6, 32)
        ids, weights = random_routing(6, 8, 2)
        torch.testing.assert_close(layer(x, ids, weights), experts_reference(x, ids, weights, gate_up, down), **FP32)


# Triton, interpreted ----------------------------------------------------------------------------


@pytest.fixture
def triton_moe(interpreted_triton: None):  # noqa: ANN201
    from omnistage.layers import fused_moe_triton

    return fused_moe_triton


def test_align_pairs_pads_each_expert_to_the_block(triton_moe) -> None:  # noqa: ANN001
    ids = torch.tensor([[3, 1], [1, 0], [3, 2], [1, 3]])
    layout = triton_moe.align_pairs(ids, num_experts=5, block_m=4)
    pairs, experts = layout.sorted_pairs.tolist(), layout.block_experts.tolist()
    num_padded = int(layout.num_padded)
    assert num_padded == 4 * 4  # experts 0, 1, 2, 3 have pairs; each run padded to one block
    flat = ids.flatten().tolist()
    for block in range(num_padded // 4):
        real = [p for p in pairs[block * 4:(block + 1) * 4] if p < len(flat)]
        assert real and all(flat[p] == experts[block] for p in real)
    assert sorted(p for p in pairs[:num_padded] if p < len(flat)) == list(range(len(flat)))
    assert all(p == len(flat) for p in pairs[num_padded:])


@pytest.mark.parametrize(("tokens", "experts", "top_k", "crowd"), [(1, 16, 4, None), (7, 16, 4, None),
                                                                   (20, 8, 2, 3)])
def test_triton_matches_torch_path(triton_moe, tokens: int, experts: int, top_k: int,  # noqa: ANN001
                                   crowd: int | None) -> None:
    # K = 40 and N = 2 * 20 are not multiples of the 32/64 tiles: the masks are exercised.
    gate_up, down = random_experts(experts, 40, 20, seed=tokens)
    x = torch.randn(tokens, 40)
    ids, weights = random_routing(tokens, experts, top_k, seed=tokens, crowd=crowd)
    got = triton_moe.fused_experts(x, ids, weights, gate_up, down, F.silu)
    torch.testing.assert_close(got, experts_sorted(x, ids, weights, gate_up, down, F.silu), **FP32)


@pytest.mark.gpu
@pytest.mark.parametrize("tokens", [1, 16, 300])
def test_triton_matches_torch_path_on_cuda_bf16(tokens: int) -> None:
    from omnistage.layers import fused_moe_triton

    gate_up, down = (w.cuda() for w in random_experts(128, 2048, 768, dtype=torch.bfloat16))
    x = torch.randn(tokens, 2048, device="cuda", dtype=torch.bfloat16)
    ids, weights = (t.cuda() for t in random_routing(tokens, 128, 8, seed=tokens))
    got = fused_moe_triton.fused_experts(x, ids, weights.bfloat16(), gate_up, down, F.silu)
    want = experts_sorted(x.float(), ids, weights, gate_up.float(), down.float(), F.silu)
    torch.testing.assert_close(got.float(), want, atol=2e-2, rtol=2e-2)  # bf16 inputs, fp32 accumulation
