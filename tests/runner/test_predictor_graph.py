"""The code predictor's loop: lockstep attention, a workspace reused across calls, and its CUDA graph replay.

The replay logic (static buffers, noise drawn before the replay, padded rows) is checked on CPU by standing in an
eager "graph" that re-runs the captured call on the static buffers; the real capture runs on CUDA (marker ``gpu``).
Codes are compared exactly only where the computation is the same (same rows, same shapes).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from omnistage.layers.attention.base import AttentionMetadata
from omnistage.layers.attention.dense import LockstepBackend
from omnistage.layers.attention.torch_sdpa import TorchSDPABackend
from omnistage.models.qwen3_omni.talker import Talker
from omnistage.runner.predictor_graph import CAPTURED_TOP_K, PredictorGraphs
from omnistage.runner.sampler import Sampler, SamplingBatch


@pytest.fixture(scope="module")
def talker(tiny_dir: Path) -> Talker:
    return Talker.from_checkpoint(tiny_dir, dtype=torch.float32)


def _paged_meta(n: int, new: int, end: int, block: int) -> AttentionMetadata:
    seq = torch.arange(n)
    slots = seq[:, None] * block + torch.arange(end - new, end)[None, :]
    return AttentionMetadata(torch.arange(n + 1, dtype=torch.int32) * new, torch.full((n,), end, dtype=torch.int32),
                             slots.flatten(), seq[:, None].to(torch.int32), [new] * n, [end] * n)


@pytest.mark.parametrize(("n", "new", "end"), [(1, 2, 2), (3, 2, 2), (3, 1, 5), (5, 1, 16), (2, 3, 7)])
def test_lockstep_attention_equals_paged_attention(n: int, new: int, end: int) -> None:
    """Same context, same new tokens: the lockstep backend's in-place rows give the paged backend's result."""
    gen = torch.Generator().manual_seed(n * 100 + end)
    heads, kv_heads, dim, block = 4, 2, 8, 16
    lock = torch.randn(2, n, block, kv_heads, dim, generator=gen)
    paged = lock.clone()  # block i of the paged cache is row i of the lockstep one
    q = torch.randn(n * new, heads, dim, generator=gen)
    k, v = torch.randn(2, n * new, kv_heads, dim, generator=gen)
    meta = _paged_meta(n, new, end, block)
    out = LockstepBackend().forward(q, k, v, lock, meta, dim**-0.5)
    expected = TorchSDPABackend().forward(q, k, v, paged, meta, dim**-0.5)
    torch.testing.assert_close(out, expected, atol=1e-6, rtol=1e-5)  # different SDPA call shapes
    torch.testing.assert_close(lock, paged, atol=0, rtol=0)  # both stored the same keys/values, nothing else


def test_workspace_is_reused_and_stale_rows_are_never_read(talker: Talker) -> None:
    hidden = torch.randn(3, 32, generator=torch.Generator().manual_seed(0))
    code0 = torch.tensor([5, 17, 60])
    first = talker.predict_residual_codes(hidden, code0)
    caches = talker.code_predictor.workspace.caches
    talker.predict_residual_codes(hidden[:1] * -2, code0[:1] + 1)  # overwrites row 0 of every cache
    again = talker.predict_residual_codes(hidden, code0)
    assert talker.code_predictor.workspace.caches is caches  # no new caches for a smaller or equal batch
    assert all(a.data_ptr() == b.data_ptr() for a, b in zip(caches, talker.code_predictor.workspace.caches))
    assert torch.equal(first, again)  # same computation on the same rows


def _sampling(n: int, seeds: list[int | None], top_k: int = 50, temperature: float = 0.9,
              greedy_rows: tuple[int, ...] = ()) -> SamplingBatch:
    temp = torch.full((n,), temperature)
    temp[list(greedy_rows)] = 0.0
    gens = [None if s is None else torch.Generator().manual_seed(s) for s in seeds]
    return SamplingBatch(temperature=temp, top_k=torch.full((n,), top_k), top_p=torch.ones(n), generators=gens,
                         all_greedy=False, any_greedy=bool(greedy_rows), needs_sort=top_k > 0,
                         max_top_k=top_k, any_top_p=False)


class _EagerGraph:
    """Replays by re-running the captured call on the static buffers (what a captured graph does)."""

    def __init__(self, graphs: PredictorGraphs, bs: int) -> None:
        self.graphs, self.bs = graphs, bs

    def replay(self) -> None:
        g = self.graphs
        out = g.model.predict_residual_codes(g.hidden[:self.bs], g.code0[:self.bs], g._sampling(self.bs))
        g.outputs[self.bs].copy_(out)


def _fake_graphs(talker: Talker, max_batch: int) -> PredictorGraphs:
    graphs = PredictorGraphs(talker, max_batch, torch.device("cpu"), torch.float32)
    for bs in graphs.sizes:
        graphs.outputs[bs] = torch.empty(bs, talker.num_code_groups, dtype=torch.long)
        graphs.graphs[bs] = _EagerGraph(graphs, bs)
    return graphs


def test_replay_equals_the_eager_loop_with_the_same_seeds(talker: Talker) -> None:
    graphs = _fake_graphs(talker, 4)
    hidden = torch.randn(4, 32, generator=torch.Generator().manual_seed(1)) * 3
    code0 = torch.tensor([1, 2, 3, 4])
    seeds = [11, 12, 13, 14]
    replayed = graphs.run(hidden, code0, Sampler(), _sampling(4, seeds, greedy_rows=(2,)))
    sampler = Sampler()
    residual = sampler.residual(_sampling(4, seeds, greedy_rows=(2,)), talker.num_code_groups - 1,
                                talker.residual_vocab_size, hidden.device)
    eager = talker.predict_residual_codes(hidden, code0, residual)
    assert torch.equal(replayed, eager)
    greedy = talker.predict_residual_codes(hidden, code0)
    assert torch.equal(replayed[2], greedy[2])  # the greedy row samples nothing


def test_padded_rows_do_not_change_the_real_ones(talker: Talker) -> None:
    """Three frames replay in the bucket of 4: their codes are the first three rows of a 4-row eager call whose
    fourth row is the padding (a zero hidden, code 0, greedy) — the same computation."""
    graphs = _fake_graphs(talker, 4)
    hidden = torch.randn(3, 32, generator=torch.Generator().manual_seed(2)) * 3
    code0 = torch.tensor([7, 8, 9])
    replayed = graphs.run(hidden, code0, Sampler(), _sampling(3, [1, 2, 3]))
    assert replayed.shape == (3, talker.num_code_groups)
    padded = _sampling(4, [1, 2, 3, None], greedy_rows=(3,))
    residual = Sampler().residual(padded, talker.num_code_groups - 1, talker.residual_vocab_size, hidden.device)
    eager = talker.predict_residual_codes(torch.cat([hidden, torch.zeros(1, 32)]), torch.tensor([7, 8, 9, 0]),
                                          residual)
    assert torch.equal(replayed, eager[:3])


def test_batches_the_graph_cannot_replay_run_eagerly(talker: Talker) -> None:
    graphs = _fake_graphs(talker, 4)
    assert graphs.can_run(_sampling(4, [1] * 4))
    assert not graphs.can_run(_sampling(5, [1] * 5))  # beyond the largest bucket
    assert not graphs.can_run(_sampling(2, [1, 2], top_k=CAPTURED_TOP_K + 1))
    top_p = _sampling(2, [1, 2])
    top_p.any_top_p = True
    assert not graphs.can_run(top_p)


@pytest.mark.gpu
def test_captured_loop_equals_eager_on_cuda(tiny_dir: Path) -> None:
    """Five frames replay in the bucket of 8; eager runs the same 8 rows (padding included): same computation."""
    talker = Talker.from_checkpoint(tiny_dir, "cuda", torch.float32)
    graphs, _ = PredictorGraphs.try_capture(talker, 8, torch.device("cuda"), torch.float32)
    assert graphs is not None and graphs.sizes == [1, 2, 4, 8]
    hidden = torch.randn(5, 32, device="cuda") * 3
    code0 = torch.tensor([1, 2, 3, 4, 5], device="cuda")

    def sampling(n: int) -> SamplingBatch:
        batch = _sampling(n, [None] * n, greedy_rows=(0, *range(5, n)))
        batch.temperature, batch.top_k, batch.top_p = (t.cuda() for t in (batch.temperature, batch.top_k,
                                                                           batch.top_p))
        batch.generators = [torch.Generator("cuda").manual_seed(s) if s < 5 else None for s in range(n)]
        return batch

    replayed = graphs.run(hidden, code0, Sampler(), sampling(5))
    residual = Sampler().residual(sampling(8), talker.num_code_groups - 1, talker.residual_vocab_size, "cuda")
    pad = 8 - 5
    eager = talker.predict_residual_codes(torch.cat([hidden, hidden.new_zeros(pad, 32)]),
                                          torch.cat([code0, code0.new_zeros(pad)]), residual)
    assert torch.equal(replayed, eager[:5])
