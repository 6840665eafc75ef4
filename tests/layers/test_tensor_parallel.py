"""Sharded layers equal the unsharded ones: two ranks over gloo (rank 1 a helper process for the whole module).

Column/row-parallel dense MLPs, MoE split by intermediate dimension (with a shared expert), and whole decoder
layers (attention heads split, KV heads split or replicated). The partial sums are added in another order than
one matmul adds them: fp32 rounding, hence the tolerance.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import asdict

import pytest
import torch

from omnistage.layers.parallel import ShardSpec, TensorParallel
from omnistage.runner.tp_group import TPGroup, host_store
from tests.layers.tp_cases import CASES, HIDDEN, build, run

FP32 = dict(atol=1e-5, rtol=1e-5)


@pytest.fixture(scope="module")
def rank0() -> Iterator[TensorParallel]:
    store, address = host_store(2)
    helper = subprocess.Popen([sys.executable, "-m", "tests.layers.tp_rank", json.dumps(asdict(address))])
    group = TPGroup(store, 0, 2, torch.device("cpu"))
    yield TensorParallel(0, 2, group)
    group.broadcast_cpu(torch.tensor([-1, 0]))
    helper.wait(30)


def _sharded(tp: TensorParallel, case: str, x: torch.Tensor) -> torch.Tensor:
    tp.group.broadcast_cpu(torch.tensor([sorted(CASES).index(case), x.shape[0]]))
    tp.group.broadcast_device(x.clone())
    with torch.inference_mode():
        return run(build(case, tp), x)


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("rows", [1, 7])
def test_sharded_layer_equals_unsharded(rank0: TensorParallel, case: str, rows: int) -> None:
    x = torch.randn(rows, HIDDEN, generator=torch.Generator().manual_seed(rows))
    with torch.inference_mode():
        expected = run(build(case), x)
    got = _sharded(rank0, case, x)
    torch.testing.assert_close(got, expected, **FP32)
    assert expected.abs().max() > 0.1  # not a trivially small output


def test_shards_partition_the_full_weight() -> None:
    full = torch.arange(2 * 12 * 3).reshape(2, 12, 3)
    gate_up = [ShardSpec(1, 2, r, blocks=2).take(full) for r in range(2)]
    # Each rank: its half of the gate rows, then its half of the up rows.
    assert torch.equal(gate_up[0], torch.cat([full[:, 0:3], full[:, 6:9]], dim=1))
    assert torch.equal(torch.cat([gate_up[0][:, :3], gate_up[1][:, :3], gate_up[0][:, 3:], gate_up[1][:, 3:]], 1),
                       full)
    heads = TensorParallel(3, 4).heads(num_heads=8, num_kv_heads=2)  # 4 ranks, 2 KV heads: replicated
    assert (heads.q, heads.kv, heads.kv_shard.parts, heads.kv_shard.index) == (2, 1, 2, 1)
    with pytest.raises(ValueError, match="does not split"):
        TensorParallel(0, 3).split(8, "intermediate_size")
