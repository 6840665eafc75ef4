"""Decode CUDA graphs: bucket sizes, padded replay, and parity with eager execution.

The replay logic (static buffers, padding rows, full-width attention into the
null block) is checked on CPU by standing in an eager "graph" that re-runs the
captured forward; the real capture is checked on CUDA (marker ``gpu``).
"""

from __future__ import annotations

import pytest
import torch

from omnistage.layers.attention.torch_sdpa_cuda import CudaSDPABackend
from omnistage.runner import ARModelRunner, TalkerStepHook
from omnistage.runner.cuda_graph import CudaGraphRunner, graph_batch_sizes
from tests.runner.helpers import collect, config, generate, make_engine, prompts, requests
from tests.runner.test_talker_hook import _request as talker_request
from tests.runner.toy_model import ToyLM, ToyTalker


def test_bucket_sizes() -> None:
    assert graph_batch_sizes(1) == [1]
    assert graph_batch_sizes(12) == [1, 2, 4, 8]
    assert graph_batch_sizes(64) == [1, 2, 4, 8, 16, 32, 48, 64]


class _EagerGraph:
    """Replays by re-running the forward on the static buffers (what a captured graph does)."""

    def __init__(self, graphs: CudaGraphRunner, bs: int) -> None:
        self.graphs, self.bs = graphs, bs

    def replay(self) -> None:
        self.graphs.outputs[self.bs].copy_(self.graphs._forward(self.bs))


def _fake_capture(runner: ARModelRunner) -> CudaGraphRunner:
    graphs = CudaGraphRunner(runner)
    hidden = runner.model.embed_tokens(torch.zeros(1, dtype=torch.int64)).shape[-1]
    for bs in graphs.sizes:
        graphs.outputs[bs] = torch.empty(bs, hidden)
        graphs.graphs[bs] = _EagerGraph(graphs, bs)
    return graphs


def test_padded_replay_matches_eager_on_cpu() -> None:
    model = ToyLM()
    token_lists = prompts(97, [3, 9, 5, 14, 2])  # 5 rows replay in the bucket of 8
    cfg = config(cuda_graph_max_batch=8)
    eager = generate(model, requests(token_lists), cfg)
    engine = make_engine(model, cfg)
    engine.runner.backend = CudaSDPABackend()
    engine.runner.graphs = _fake_capture(engine.runner)
    replays = []
    engine.runner.graphs.run = _counting(engine.runner.graphs.run, replays)
    for request in requests(token_lists):
        engine.add_request(request)
    assert collect(engine.run_until_done()) == eager
    assert replays and set(replays) <= {5, 4, 3, 2, 1}
    assert engine.runner.kv_caches[0][:, 1:].abs().sum() > 0  # real blocks written, padding went to block 0


def _counting(run, sink: list[int]):
    def wrapped(inputs, embeds):
        sink.append(inputs.meta.num_seqs)
        return run(inputs, embeds)
    return wrapped


@pytest.mark.gpu
def test_cuda_graph_decode_matches_eager() -> None:
    model = ToyLM().cuda()
    token_lists = prompts(97, [3, 9, 5, 14, 2, 7])
    eager = generate(model, requests(token_lists), config(device="cuda", enforce_eager=True))
    engine = make_engine(model, config(device="cuda", cuda_graph_max_batch=16))
    assert engine.runner.graphs is not None and sorted(engine.runner.graphs.graphs) == [1, 2, 4, 8, 16]
    for request in requests(token_lists):
        engine.add_request(request)
    assert collect(engine.run_until_done()) == eager


@pytest.mark.gpu
def test_cuda_graph_talker_frames_match_eager() -> None:
    talker = ToyTalker(seed=1).cuda()

    def run(enforce_eager: bool) -> dict[str, list[int]]:
        engine = make_engine(talker, config(device="cuda", enforce_eager=enforce_eager), TalkerStepHook(talker))
        if not enforce_eager:
            assert engine.runner.graphs is not None and engine.runner.graphs.embeds is not None
        for i, (p, t) in enumerate([(5, 3), (9, 12), (2, 0)]):
            engine.add_request(talker_request(f"t{i}", talker, p, t))  # host tensors; the runner moves them
        return collect(engine.run_until_done())

    assert run(False) == run(True)
