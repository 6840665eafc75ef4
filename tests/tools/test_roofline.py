"""bench roofline: the bytes a step must read, counted from the calls it makes, and the report."""

from __future__ import annotations

import argparse
import json

import torch
from torch import nn

from omnistage.layers.attention.base import AttentionMetadata
from omnistage.layers.attention.context import ForwardContext, forward_context
from omnistage.layers.attention.torch_sdpa import TorchSDPABackend
from omnistage.layers.linear import GatedMLP
from omnistage.layers.moe import FusedExperts
from omnistage.tools.bench import roofline
from omnistage.tools.bench.step_bytes import StepBytes


class _Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(50, 8)
        self.proj = nn.Linear(8, 8)  # weight + bias
        self.experts = FusedExperts(6, 8, 4)

    def forward(self, ids: torch.Tensor, routed: torch.Tensor) -> torch.Tensor:
        x = self.proj(self.proj(self.embed(ids)))  # the projection is read twice
        return self.experts(x, routed, torch.full(routed.shape, 0.5))


def test_counts_rows_calls_and_selected_experts() -> None:
    net = _Net()
    with torch.no_grad():
        net.experts.gate_up_proj.normal_()
        net.experts.down_proj.normal_()
    routed = torch.tensor([[0, 3], [3, 5], [0, 5]])  # 3 tokens, 3 distinct experts of 6
    with torch.no_grad(), StepBytes(net) as counter:
        net(torch.tensor([1, 2, 3]), routed)
    tally = counter.tally
    assert tally.embedding_rows == 3 * 8 * 4
    assert tally.weights == 2 * (8 * 8 + 8) * 4
    per_expert = (2 * 4 * 8 + 8 * 4) * 4
    assert tally.experts == 3 * per_expert and tally.active_experts == [3]
    # 2 flops per multiply-add: the projection's matrix twice over 3 rows, and 6 (token, expert) pairs.
    assert tally.matmul_flops == 2 * (2 * 3 * 8 * 8) + 2 * 6 * (2 * 4 * 8 + 8 * 4)
    # Hooks are gone afterwards.
    with torch.no_grad():
        net(torch.tensor([1]), routed[:1])
    assert counter.tally.total == tally.total


class _Functional(nn.Module):
    """Reads ``norm``'s weight without calling it (as the decoder layers do) and calls ``mlp``, whose gate/up/down
    are read through one stacked matmul, never called themselves."""

    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(8, elementwise_affine=True, bias=False)
        self.mlp = GatedMLP(8, 16)
        self.unused = nn.Embedding(100, 8)  # neither called nor counted

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.mlp(nn.functional.layer_norm(x, (8,), self.norm.weight))


def test_counts_weights_read_without_a_call_of_their_own() -> None:
    net = _Functional()
    with torch.no_grad(), StepBytes(net) as counter:
        net(torch.randn(3, 8))
        net(torch.randn(2, 8))
    mlp_bytes = 3 * 8 * 16 * 4  # gate, up, down: each read once per call of the MLP
    assert counter.tally.weights == 2 * (8 * 4 + mlp_bytes)
    assert counter.tally.matmul_flops == 2 * (3 + 2) * 3 * 8 * 16  # the MLP's three matrices over 5 rows in all
    assert counter.tally.embedding_rows == 0


def test_counts_the_kv_cache_read_through_the_window() -> None:
    class Attn(nn.Module):
        layer_idx, sliding_window = 0, 4

        def forward(self) -> None:
            return None

    attn = Attn()
    cache = torch.zeros(2, 8, 4, 2, 16)  # 2 KV heads of 16, fp32: 256 bytes per token for K and V
    meta = AttentionMetadata(torch.tensor([0, 1, 2]), torch.tensor([3, 9]), torch.tensor([2, 8]),
                             torch.zeros(2, 3, dtype=torch.int32), [1, 1], [3, 9])
    with forward_context(ForwardContext(meta, TorchSDPABackend(), [cache])), StepBytes(attn) as counter:
        attn()
    assert counter.tally.kv_cache == (3 + 4) * 256  # the second sequence reads only its window


def test_report_on_the_tiny_checkpoint(tiny_dir) -> None:  # noqa: ANN001
    args = argparse.Namespace(model=str(tiny_dir), stage="thinker", batch=[1, 3], steps=3, prompt_len=8, frames=8,
                              device="cpu", dtype="float32", threads=1, json_out=None, quantization="none")
    report = json.loads(json.dumps(roofline.roofline(args)))  # (main also sets the thread count: not in a test)
    assert report["bandwidth_gbps"] > 0 and [r["batch"] for r in report["results"]] == [1, 3]
    for row in report["results"]:
        assert row["bytes"] == row["weight_bytes"] + row["expert_bytes"] + row["kv_bytes"]
        floor_ms = row["bytes"] / (row["bandwidth_gbps"] * 1e9) * 1e3
        assert abs(row["floor_ratio"] - row["step_ms"] / floor_ms) < 0.01 * row["floor_ratio"] + 1e-3
        assert row["expert_bytes"] > 0 and row["kv_bytes"] > 0
        compute_ms = row["matmul_flops"] / (report["matmul_gflops"] * 1e9) * 1e3
        assert abs(row["compute_floor_ms"] - compute_ms) < 0.01 * compute_ms + 1e-3
        assert row["roofline_ratio"] <= row["floor_ratio"] + 1e-3
    one, three = report["results"]
    assert three["kv_bytes"] > one["kv_bytes"]  # three sequences' contexts


def test_report_on_the_tts_talker(tmp_path) -> None:  # noqa: ANN001
    """--stage tts-talker: a frame's step reads the talker's layers once and the code predictor's per code group."""
    from omnistage.models.qwen3_tts.checkpoint import Qwen3TTSModels
    from omnistage.families.qwen3_tts.make_tiny import make_tiny_tts

    folder = make_tiny_tts(tmp_path / "tts", seed=0)
    args = argparse.Namespace(model=str(folder), stage="tts-talker", batch=[1, 2], steps=2, prompt_len=24, frames=8,
                              device="cpu", dtype="float32", threads=1, json_out=None, quantization="none")
    report = json.loads(json.dumps(roofline.roofline(args)))
    talker = Qwen3TTSModels.load(folder).talker
    floor = _bytes(talker.model.layers) + _predictor_bytes(talker)
    for row in report["results"]:
        assert row["stage"] == "tts-talker" and row["weight_bytes"] >= floor and row["kv_bytes"] > 0


def _bytes(module: nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in module.parameters())


def _predictor_bytes(talker: nn.Module) -> int:
    """What one predict call must read: per pass every layer, the final norm, that pass's head and the
    projection of its new rows (a linear in the tiny model, whose predictor is narrower than the talker)."""
    cp = talker.code_predictor
    passes = cp.num_code_groups - 1
    per_pass = _bytes(cp.model.layers) + _bytes(cp.model.norm) + _bytes(cp.small_to_mtp_projection)
    return passes * per_pass + _bytes(cp.lm_head)


def test_the_code_predictors_lockstep_passes_are_counted(tmp_path) -> None:  # noqa: ANN001
    """The lockstep stack calls no layer module: its passes are counted from the decoder's final norm, every
    layer once per pass, int8 weights at one byte each once quantized."""
    from omnistage.layers.quant.apply import apply_quantization
    from omnistage.models.qwen3_tts.checkpoint import Qwen3TTSModels
    from omnistage.families.qwen3_tts.make_tiny import make_tiny_tts

    talker = Qwen3TTSModels.load(make_tiny_tts(tmp_path / "tts", seed=0)).talker
    hidden, code0 = torch.randn(3, talker.config.stack.hidden_size), torch.tensor([1, 2, 3])
    with torch.inference_mode():
        talker.predict_residual_codes(hidden, code0)  # the workspace's first call builds its stack
        full = _predictor_bytes(talker)
        with StepBytes(talker) as counter:
            talker.predict_residual_codes(hidden, code0)
        assert counter.tally.weights == full
        apply_quantization(talker, "int8")
        quantized = _predictor_bytes(talker)
        with StepBytes(talker) as counter:
            talker.predict_residual_codes(hidden, code0)
    assert counter.tally.weights == quantized
    layers = talker.code_predictor.model.layers
    matrices = sum(p.numel() for p in layers.parameters() if p.dim() == 2)
    assert {p.dtype for p in layers.parameters() if p.dim() == 2} == {torch.int8}
    passes = talker.code_predictor.num_code_groups - 1
    assert full - quantized == passes * 3 * matrices  # 4 bytes a weight in fp32, 1 in int8


def test_report_on_the_tts_predictor(tmp_path) -> None:  # noqa: ANN001
    """--stage tts-predictor --quantization int8: the code predictor alone, its int8 bytes per frame."""
    from omnistage.layers.quant.apply import apply_quantization
    from omnistage.models.qwen3_tts.checkpoint import Qwen3TTSModels
    from omnistage.families.qwen3_tts.make_tiny import make_tiny_tts

    folder = make_tiny_tts(tmp_path / "tts", seed=0)
    args = argparse.Namespace(model=str(folder), stage="tts-predictor", batch=[1, 4], steps=2, prompt_len=8,
                              frames=8, device="cpu", dtype="float32", threads=1, json_out=None,
                              quantization="int8")
    report = json.loads(json.dumps(roofline.roofline(args)))
    talker = Qwen3TTSModels.load(folder).talker
    apply_quantization(talker, "int8")
    assert report["quantization"] == "int8" and [r["batch"] for r in report["results"]] == [1, 4]
    passes, width = talker.code_predictor.num_code_groups - 1, talker.config.stack.hidden_size
    for row in report["results"]:
        # Plus the embedding rows looked up: code 0's, then each pass's new code but the last (fp32, talker-wide).
        rows = row["batch"] * passes * width * 4
        assert row["stage"] == "tts-predictor" and row["weight_bytes"] == _predictor_bytes(talker) + rows
        assert row["floor_ratio"] > 0
