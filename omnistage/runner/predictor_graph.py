"""The code predictor's whole loop as one CUDA graph per batch bucket (CUDA only).

At real widths the talker's time goes to the code predictor's ``G - 1`` sequential passes per frame, and at
small batches each pass is a few dozen kernel launches: launch-bound. Replaying the whole loop (every pass, every
residual codebook's sampling) as one graph removes the launches and the Python between them.

The loop is capturable because it is tensors only: lockstep attention with shapes fixed by ``(N, step)``, and
sampling from noise drawn before the replay (``Sampler.residual``), so per-request seeded generators stay outside
the graph. Rows are padded to the bucket (greedy rows with code 0); a batch that cannot be replayed (larger than
the largest bucket, or a row using top-p or a top-k wider than the captured width) runs eagerly.
"""

from __future__ import annotations

import bisect

import torch

from omnistage.runner.base import TalkerModel
from omnistage.runner.cuda_graph import CaptureOutcome, capture_or_eager, graph_batch_sizes
from omnistage.runner.sampler import ResidualSampling, Sampler, SamplingBatch

CAPTURED_TOP_K = 64  # the top-k width of the captured sampling (the talker's default is 50)


class PredictorGraphs:
    def __init__(self, model: TalkerModel, max_batch: int, device: torch.device, dtype: torch.dtype) -> None:
        self.model = model
        self.sizes = graph_batch_sizes(max_batch)
        self.steps = model.num_code_groups - 1
        vocab, bs = model.residual_vocab_size, self.sizes[-1]
        hidden = model.embed_tokens(torch.zeros(1, dtype=torch.long, device=device)).shape[-1]
        self.hidden = torch.zeros(bs, hidden, dtype=dtype, device=device)
        self.code0 = torch.zeros(bs, dtype=torch.long, device=device)
        self.noise = torch.ones(self.steps, bs, vocab, device=device)
        self.batch = SamplingBatch(
            temperature=torch.zeros(bs, device=device), top_k=torch.zeros(bs, dtype=torch.long, device=device),
            top_p=torch.ones(bs, device=device), generators=[None] * bs, all_greedy=False, any_greedy=True,
            needs_sort=True, max_top_k=CAPTURED_TOP_K, any_top_p=False)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, torch.Tensor] = {}

    @classmethod
    def try_capture(cls, model: TalkerModel, max_batch: int, device: torch.device,
                    dtype: torch.dtype) -> tuple[PredictorGraphs | None, CaptureOutcome]:
        """The loop's graphs; None (eager) with the failure, logged at warning, when it cannot be captured."""
        graphs = cls(model, max_batch, device, dtype)
        outcome = capture_or_eager("code predictor", graphs.capture)
        return (graphs if outcome.captured else None), outcome

    def _sampling(self, bs: int) -> ResidualSampling:
        b = self.batch
        rows = SamplingBatch(temperature=b.temperature[:bs], top_k=b.top_k[:bs], top_p=b.top_p[:bs],
                             generators=b.generators[:bs], all_greedy=False, any_greedy=True, needs_sort=True,
                             max_top_k=CAPTURED_TOP_K, any_top_p=False)
        return ResidualSampling(rows, self.noise[:, :bs])

    @torch.inference_mode()
    def capture(self) -> None:
        pool = None
        for bs in reversed(self.sizes):  # largest first: the workspace's caches are sized once
            sampling = self._sampling(bs)
            for _ in range(2):  # warm-up: the workspace's caches and per-step metadata are made here
                self.model.predict_residual_codes(self.hidden[:bs], self.code0[:bs], sampling)
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                self.outputs[bs] = self.model.predict_residual_codes(self.hidden[:bs], self.code0[:bs], sampling)
            pool = graph.pool() if pool is None else pool
            self.graphs[bs] = graph
        torch.cuda.synchronize()

    def can_run(self, sampling: SamplingBatch) -> bool:
        """Within the largest bucket, and sampling the captured graph does: greedy, temperature, top-k up to
        ``CAPTURED_TOP_K`` (top-k 0 rows stay unrestricted there too), no top-p."""
        if len(sampling.generators) > self.sizes[-1]:
            return False
        if sampling.all_greedy or not sampling.needs_sort:
            return True
        return sampling.any_top_p is False and sampling.max_top_k is not None \
            and sampling.max_top_k <= CAPTURED_TOP_K

    def run(self, hidden: torch.Tensor, code0: torch.Tensor, sampler: Sampler, sampling: SamplingBatch) -> torch.Tensor:
        """Codes ``[N, G]`` of N frames, as ``predict_residual_codes`` with ``sampler.residual(sampling)``."""
        n = hidden.shape[0]
        bs = self.sizes[bisect.bisect_left(self.sizes, n)]
        self.hidden[:n].copy_(hidden)
        self.code0[:n].copy_(code0)
        b = self.batch
        b.temperature[:n].copy_(sampling.temperature)
        b.temperature[n:bs].zero_()  # padded rows: greedy
        b.top_k[:n].copy_(sampling.top_k)
        if not sampling.all_greedy:
            residual = sampler.residual(sampling, self.steps, self.noise.shape[-1], hidden.device, whole_vocab=True)
            assert residual.noise is not None
            self.noise[:, :n].copy_(residual.noise)
        self.graphs[bs].replay()
        return self.outputs[bs][:n]
