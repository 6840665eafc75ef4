"""KV cache sized from a memory budget: the block count follows the budget; too small a budget fails at start-up."""

from __future__ import annotations

import pytest
import torch

from omnistage.config.memory import parse_bytes
from omnistage.config.pipeline import ConfigError, StageOverrides, apply_overrides, load_preset, parse_pipeline
from omnistage.families.qwen3_omni.family import PRESET as OMNI_PRESET
from omnistage.engine.kv_sizing import KVBudgetError, blocks_for_budget, gpu_kv_budget, kv_block_bytes
from omnistage.ipc.messages import ReplicaLoad
from omnistage.pipeline.orchestrator import kv_cache_bytes
from omnistage.runner.step_hook import StepHook
from omnistage.workers.base import engine_config
from tests.runner.helpers import config, generate, make_engine, prompts, requests
from tests.runner.toy_model import ToyLM

SPEC = (2, 2, 8)  # layers, KV heads, head dim


@pytest.mark.parametrize(("text", "value"), [("2GiB", 2 << 30), ("512MiB", 512 << 20), ("1.5GB", 1_500_000_000),
                                             ("4096", 4096), (" 3 kib ", 3072), (10, 10)])
def test_parse_bytes(text: str | int, value: int) -> None:
    assert parse_bytes(text) == value


@pytest.mark.parametrize("text", ["", "2 parsecs", "GiB", "-1", "1e9"])
def test_parse_bytes_rejects(text: str) -> None:
    with pytest.raises(ValueError, match="memory size"):
        parse_bytes(text)


def test_block_count_follows_the_budget() -> None:
    per_block = kv_block_bytes(SPEC, 16, torch.float32)
    assert per_block == 2 * 2 * 16 * 2 * 8 * 4
    small = blocks_for_budget(SPEC, 16, torch.float32, 100 * per_block, max_model_len=256)
    large = blocks_for_budget(SPEC, 16, torch.float32, 400 * per_block + per_block // 2, max_model_len=256)
    assert (small, large) == (100, 400)  # usable blocks + the null block; a partial block is not a block
    assert blocks_for_budget(SPEC, 16, torch.bfloat16, 100 * per_block, 256) == 200  # half the bytes per block


def test_state_kept_per_slot_counts_in_each_block() -> None:
    """A thinker keeping a hidden row per slot beside the KV: each block costs its KV and its rows."""
    per_block = kv_block_bytes(SPEC, 16, torch.float32)
    rows = per_block // 16  # a row as large as a slot's KV: a block costs twice as much
    assert blocks_for_budget(SPEC, 16, torch.float32, 200 * per_block, 256, slot_bytes=rows) == 100


def test_budget_below_one_request_is_refused_with_the_figures() -> None:
    per_block = kv_block_bytes(SPEC, 16, torch.float32)
    assert blocks_for_budget(SPEC, 16, torch.float32, 17 * per_block, max_model_len=256) == 17  # exactly enough
    with pytest.raises(KVBudgetError, match=r"holds 15 blocks .* max_model_len=256 needs 16"):
        blocks_for_budget(SPEC, 16, torch.float32, 16 * per_block, max_model_len=256)


def test_gpu_budget_takes_weights_and_activations_out_of_the_share() -> None:
    gib = 1 << 30
    assert gpu_kv_budget(0.5, total=80 * gib, free=70 * gib, weights=20 * gib, activation_peak=2 * gib) == 18 * gib
    # Another process holds most of the device: never more than is free less the activations.
    assert gpu_kv_budget(0.9, total=80 * gib, free=10 * gib, weights=20 * gib, activation_peak=2 * gib) == 8 * gib
    assert gpu_kv_budget(0.2, total=80 * gib, free=70 * gib, weights=20 * gib, activation_peak=2 * gib) == 0
    with pytest.raises(ValueError, match="gpu_memory_utilization"):
        gpu_kv_budget(1.5, 1, 1, 0, 0)


def test_runner_sizes_its_pool_from_kv_cache_memory() -> None:
    model = ToyLM()
    per_block = kv_block_bytes(tuple(model.kv_cache_spec()), 4, torch.float32)
    engine = make_engine(model, config(kv_cache_memory=60 * per_block, num_blocks=2))
    assert engine.runner.num_blocks == 60 and engine.runner.kv_caches[0].shape[1] == 60
    assert engine.scheduler.kv.usable_blocks == 59  # the scheduler's pool mirrors the runner's
    # The sized engine serves like a fixed-size one.
    token_lists = prompts(97, [3, 9, 5])
    assert generate(model, requests(token_lists), config(kv_cache_memory=60 * per_block)) == \
        generate(model, requests(token_lists), config())


def test_runner_refuses_a_budget_below_one_request() -> None:
    model = ToyLM()
    per_block = kv_block_bytes(tuple(model.kv_cache_spec()), 4, torch.float32)
    with pytest.raises(KVBudgetError, match="max_model_len=128"):  # 128 tokens need 32 blocks of 4
        make_engine(model, config(kv_cache_memory=20 * per_block))


def test_stage_config_and_flags_set_the_budget() -> None:
    spec = parse_pipeline({"stages": [{"name": "thinker", "kind": "ar", "model": "thinker",
                                       "engine": {"kv_cache_memory": "1GiB", "max_model_len": 4096}},
                                      {"name": "code2wav", "kind": "generation", "model": "code2wav"}]})
    engine = spec.stage("thinker").engine
    assert engine.kv_cache_memory == 1 << 30 and engine.model_len(65536) == 4096
    cfg = engine_config(spec.stage("thinker"), "cpu", torch.float32, 65536)
    assert cfg.kv_cache_memory == 1 << 30 and cfg.max_model_len == 4096
    with pytest.raises(ConfigError, match=r"stages\[0\].engine.kv_cache_memory: not a memory size"):
        parse_pipeline({"stages": [{"name": "t", "kind": "ar", "model": "thinker",
                                    "engine": {"kv_cache_memory": "lots"}}]})
    preset = load_preset(OMNI_PRESET)
    fixed = preset.stage("thinker").engine
    assert fixed.model_len(65536) == fixed.num_kv_blocks * fixed.block_size  # no budget: the pool caps the length
    over = apply_overrides(preset, StageOverrides(dtype="bfloat16", kv_cache_memory=(("", 2 << 30),),
                                                  gpu_memory_utilization=(("talker", 0.3),)))
    assert [s.engine.kv_cache_memory for s in over.stages] == [2 << 30, 2 << 30, 0]  # code2wav keeps no KV
    assert [s.engine.gpu_memory_utilization for s in over.stages] == [0.0, 0.3, 0.0]
    assert {s.dtype for s in over.stages} == {"bfloat16"}
    with pytest.raises(ConfigError, match="unknown stage 'vocoder'"):
        apply_overrides(preset, StageOverrides(kv_cache_memory=(("vocoder", 1),)))


def test_reported_pool_bytes() -> None:
    assert kv_cache_bytes(ReplicaLoad(kv_blocks_total=99, kv_block_bytes=1024)) == 100 * 1024
    assert kv_cache_bytes(ReplicaLoad()) == 0


def test_worker_reports_blocks_and_bytes(tiny_dir) -> None:  # noqa: ANN001
    from omnistage.families.qwen3_omni.workers import ThinkerWorker
    from omnistage.workers.base import WorkerSpec

    stage = parse_pipeline({"stages": [{"name": "thinker", "kind": "ar", "model": "thinker", "device": "cpu",
                                        "engine": {"kv_cache_memory": "4MiB", "max_model_len": 512}}]}).stages[0]
    load = ThinkerWorker(WorkerSpec(str(tiny_dir), stage)).load()
    assert load.kv_block_bytes > 0
    assert load.kv_blocks_total == (4 << 20) // load.kv_block_bytes - 1
    assert kv_cache_bytes(load) <= 4 << 20


def test_graph_pool_estimate_scales_with_the_largest_captured_batch() -> None:
    from omnistage.engine.kv_sizing import GRAPH_SEGMENT_BYTES, graph_pool_bytes

    mib = 1 << 20
    assert graph_pool_bytes(512 * mib, 512, []) == 0  # eager: no pool
    assert graph_pool_bytes(512 * mib, 512, [1, 2, 4, 8, 16]) == 16 * mib + 5 * GRAPH_SEGMENT_BYTES


def test_gpu_budget_keeps_room_outside_torch_and_for_the_graph_pool(monkeypatch: pytest.MonkeyPatch) -> None:
    """A fake 80 GiB device on CPU: the runner's sizing takes the context and the graphs' pool out of its share."""
    from types import SimpleNamespace

    from omnistage.engine.kv_sizing import CUDA_CONTEXT_BYTES, NCCL_BYTES, graph_pool_bytes
    from omnistage.runner import memory_profile

    gib = 1 << 30
    model = ToyLM()
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (76 * gib, 80 * gib))
    monkeypatch.setattr(memory_profile, "activation_peak", lambda runner: 256 << 20)
    cfg = config(gpu_memory_utilization=0.5, cuda_graph_max_batch=16, max_num_batched_tokens=256)
    runner = SimpleNamespace(config=cfg, device=torch.device("cuda"), model=model, hook=StepHook())
    spec = tuple(model.kv_cache_spec())
    per_block = kv_block_bytes(spec, cfg.block_size, cfg.dtype)
    pool = graph_pool_bytes(256 << 20, 128, [1, 2, 4, 8, 16])  # profiled tokens: min(256, max_model_len=128)
    assert pool == (256 << 20) * 16 // 128 + 5 * (2 << 20)
    budget = 40 * gib - weights - (256 << 20) - CUDA_CONTEXT_BYTES - pool
    assert memory_profile.kv_pool_plan(runner, spec).num_blocks == budget // per_block
    plain = gpu_kv_budget(0.5, 80 * gib, 76 * gib, weights, 256 << 20)  # the rule without reserves
    assert plain - budget == CUDA_CONTEXT_BYTES + pool
    # A tensor-parallel rank captures no graphs but holds NCCL's buffers.
    sharded = 40 * gib - weights - (256 << 20) - CUDA_CONTEXT_BYTES - NCCL_BYTES
    assert memory_profile.kv_pool_plan(runner, spec, tensor_parallel=True).num_blocks == sharded // per_block
    # Eager: no pool to keep.
    eager = SimpleNamespace(config=config(gpu_memory_utilization=0.5, enforce_eager=True), device=runner.device,
                            model=model, hook=StepHook())
    assert memory_profile.kv_pool_plan(eager, spec).num_blocks == (budget + pool) // per_block
