"""A CUDA-graph capture that fails is reported, not hidden: a warning, the runner's outcomes, the replica's load,
and the /metrics gauges; the stage then runs eagerly with the same tokens. Forced on CPU: this torch has no CUDA,
so the real capture path fails at its first CUDA call."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest
import torch

from omnistage.entrypoints.openai.common.metrics import ServerMetrics
from omnistage.pipeline.reports import EngineStats, ReplicaStats
from omnistage.runner.cuda_graph import CaptureOutcome, CudaGraphRunner, capture_or_eager, describe
from omnistage.workers.base import kv_load
from tests.runner.helpers import config, generate, make_engine, prompts, requests
from tests.runner.toy_model import ToyLM

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="forces a failure that only happens without CUDA")


def test_failed_capture_is_logged_and_returned(caplog: pytest.LogCaptureFixture) -> None:
    def host_sync() -> None:
        raise RuntimeError("operation not permitted when stream is capturing")

    with caplog.at_level(logging.WARNING, logger="omnistage.runner.cuda_graph"):
        outcome = capture_or_eager("decode", host_sync)
    assert outcome == CaptureOutcome("decode", False, "RuntimeError: operation not permitted when stream is capturing")
    assert "decode CUDA graph capture failed" in caplog.text and "running eagerly" in caplog.text
    assert capture_or_eager("code predictor", lambda: None) == CaptureOutcome("code predictor", True)
    assert describe([outcome, CaptureOutcome("code predictor", True)]).startswith("decode: FAILED (RuntimeError")
    assert describe([]) == "eager (no graphs asked for)"


def test_runner_falls_back_to_eager_and_reports_it(caplog: pytest.LogCaptureFixture) -> None:
    model = ToyLM()
    token_lists = prompts(97, [3, 9, 5])
    engine = make_engine(model, config(cuda_graph_max_batch=8))
    runner = engine.runner
    with caplog.at_level(logging.WARNING, logger="omnistage.runner.cuda_graph"):
        graphs, outcome = CudaGraphRunner.try_capture(runner)  # its first torch.cuda call fails here
    assert graphs is None and not outcome.captured and outcome.error
    runner.graphs, runner.capture_outcomes = graphs, (outcome,)
    for request in requests(token_lists):
        engine.add_request(request)
    tokens: dict[str, list[int]] = {}
    for out in engine.run_until_done():
        tokens.setdefault(out.request_id, []).extend(out.new_token_ids)
    assert tokens == generate(model, requests(token_lists), config(enforce_eager=True))
    load = kv_load(engine)
    assert (load.graphs_captured, load.graph_capture_failures) == (0, 1)
    assert "CUDA graph capture failed" in caplog.text


def test_cpu_runner_reports_no_graphs() -> None:
    load = kv_load(make_engine(ToyLM(), config()))
    assert (load.graphs_captured, load.graph_capture_failures) == (0, 0)


class _Engine:
    front_end = SimpleNamespace(audio=None)  # no audio: the metrics' player needs no rate

    def stats(self) -> EngineStats:
        return EngineStats((ReplicaStats("thinker", 0, 1, 10, 0, 1, graphs_captured=0, graph_capture_failures=1),
                            ReplicaStats("talker", 0, 1, 10, 0, 1, graphs_captured=2)))


def test_metrics_show_capture_failures() -> None:
    text = ServerMetrics(_Engine()).render().decode()  # type: ignore[arg-type]
    assert 'omnistage_cuda_graph_capture_failures{replica="0",stage="thinker"} 1.0' in text
    assert 'omnistage_cuda_graphs_captured{replica="0",stage="talker"} 2.0' in text
