"""A CPU stage's KV cache: sized from vLLM's 4 GiB default budget unless told otherwise, never more than the memory
allows, optionally stored in bfloat16; the budget, blocks and tokens are logged at start-up."""

from __future__ import annotations

import logging
import os
from types import SimpleNamespace

import pytest
import torch

from omnistage.config.pipeline import ConfigError, StageOverrides, apply_overrides, load_preset, parse_pipeline
from omnistage.engine.kv_sizing import (
    CPU_DEFAULT_KV_BYTES, KVBudgetError, KVPlan, available_memory, cpu_default_budget, kv_block_bytes,
)
from omnistage.families.qwen3_tts.family import PRESET as TTS_PRESET
from omnistage.layers.attention.base import AttentionMetadata
from omnistage.layers.attention.torch_sdpa import TorchSDPABackend
from omnistage.runner.ar_runner import check_kv_dtype
from omnistage.runner.memory_profile import kv_pool_plan
from omnistage.runner.step_hook import StepHook
from omnistage.sampling_params import SamplingParams
from omnistage.workers.base import engine_config
from tests.runner.helpers import config, generate, make_engine, prompts, requests
from tests.runner.toy_model import ToyLM

GIB = 1 << 30


def test_default_budget_is_4gib_or_half_the_available_memory() -> None:
    assert cpu_default_budget(64 * GIB) == CPU_DEFAULT_KV_BYTES == 4 * GIB
    assert cpu_default_budget(6 * GIB) == 3 * GIB  # a small machine: half of what is available
    assert 0 < available_memory()


def _plan(**overrides: object) -> tuple[KVPlan, int]:
    """The CPU runner's pool for a ToyLM under ``config(**overrides)``, and its block's bytes (nothing allocated)."""
    model = ToyLM()
    cfg = config(**overrides)
    runner = SimpleNamespace(config=cfg, device=torch.device("cpu"), model=model, hook=StepHook())
    spec = tuple(model.kv_cache_spec())
    return kv_pool_plan(runner, spec), kv_block_bytes(spec, cfg.block_size, cfg.cache_dtype)


def test_a_cpu_stage_without_a_budget_gets_the_default() -> None:
    # Blocks of 64Ki tokens (16 MiB each): the configured million blocks would be 16 TiB; the budget caps them.
    plan, per_block = _plan(block_size=1 << 16, num_blocks=1_000_000, max_model_len=1 << 16)
    assert plan.source == "CPU default" and 0 < plan.budget <= 4 * GIB
    assert plan.num_blocks == plan.budget // per_block < 1_000_000
    assert plan.tokens == (plan.num_blocks - 1) * (1 << 16)
    # A small configured pool stays as configured: num_kv_blocks is the most blocks, the budget the most bytes.
    small, _ = _plan(num_blocks=100)
    assert (small.num_blocks, small.source) == (100, "CPU default")


def test_bfloat16_kv_holds_twice_the_tokens_of_a_budget() -> None:
    fp32, per_block = _plan(kv_cache_memory=64 * kv_block_bytes((2, 2, 8), 4, torch.float32))
    bf16, bf16_block = _plan(kv_cache_memory=fp32.budget, kv_cache_dtype=torch.bfloat16)
    assert bf16_block * 2 == per_block and (fp32.num_blocks, bf16.num_blocks) == (64, 128)
    assert bf16.tokens == 2 * fp32.tokens + 4 and bf16.dtype == torch.bfloat16


def test_a_budget_above_the_available_memory_is_refused() -> None:
    with pytest.raises(KVBudgetError, match="available memory"):
        _plan(kv_cache_memory=available_memory() + GIB)


def test_start_up_logs_budget_blocks_and_tokens(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="omnistage.runner.ar_runner"):
        engine = make_engine(ToyLM(), config(num_blocks=33, kv_cache_dtype=torch.bfloat16))
    assert engine.runner.kv_caches[0].dtype == torch.bfloat16
    line = next(r.getMessage() for r in caplog.records if "KV cache" in r.getMessage())
    assert "(CPU default)" in line and "32 blocks of 4 tokens = 128 tokens" in line and "bfloat16" in line
    with caplog.at_level(logging.WARNING, logger="omnistage.runner.ar_runner"):
        make_engine(ToyLM(), config(num_blocks=9))  # 32 tokens, max_model_len 128
    assert any("holds 32 tokens, less than max_model_len (128)" in r.getMessage() for r in caplog.records)


def test_bfloat16_kv_attention_is_close_to_float32() -> None:
    """Decode rows read the cache in place, a prefill continuing a cached prefix gathers it: both cast it back."""
    gen = torch.Generator().manual_seed(0)
    heads, kv_heads, dim, block, blocks = 4, 2, 8, 4, 16
    ks, vs = torch.randn(24, kv_heads, dim, generator=gen), torch.randn(24, kv_heads, dim, generator=gen)
    q = torch.randn(24, heads, dim, generator=gen)
    tables = torch.tensor([[1, 2, 3, 0], [5, 7, 9, 11]], dtype=torch.int32)
    outs = {}
    for dtype in (torch.float32, torch.bfloat16):
        cache = torch.zeros(2, blocks, block, kv_heads, dim, dtype=dtype)
        backend = TorchSDPABackend()
        backend.forward(q[:20], ks[:20], vs[:20], cache, _meta([9, 11], [9, 11], tables), 0.35)
        resumed = _meta([1, 3], [10, 14], tables)  # a decode row, and a prefill after a cached prefix
        outs[dtype] = backend.forward(q[20:], ks[20:], vs[20:], cache, resumed, 0.35)
    # bf16 keeps 8 bits of mantissa: keys and values within ~0.4% each.
    torch.testing.assert_close(outs[torch.bfloat16], outs[torch.float32], atol=2e-2, rtol=2e-2)


def _meta(query_lens: list[int], context_lens: list[int], tables: torch.Tensor) -> AttentionMetadata:
    """New tokens at the end of each context, stored in the given blocks of 4 slots."""
    starts, slots = [0], []
    for q_len, ctx, table in zip(query_lens, context_lens, tables.tolist()):
        starts.append(starts[-1] + q_len)
        slots += [table[p // 4] * 4 + p % 4 for p in range(ctx - q_len, ctx)]
    return AttentionMetadata(torch.tensor(starts, dtype=torch.int32), torch.tensor(context_lens, dtype=torch.int32),
                             torch.tensor(slots), tables, query_lens, context_lens)


def test_bfloat16_kv_serves_with_prefix_caching() -> None:
    """A bf16 cache through the whole engine: shared prefixes hit, and greedy tokens match the fp32 cache's on a
    toy model whose margins are wide (the cache rounding moves logits by far less than their gaps)."""
    model = ToyLM()
    shared = prompts(97, [12])[0]
    token_lists = [shared + tail for tail in prompts(97, [3, 5, 2], seed=1)]
    cfg = config(enable_prefix_caching=True)
    fp32 = generate(model, requests(token_lists), cfg)
    bf16 = generate(model, requests(token_lists), config(enable_prefix_caching=True, kv_cache_dtype=torch.bfloat16))
    assert bf16 == fp32


def test_kv_cache_dtype_from_stage_config_and_flag() -> None:
    spec = parse_pipeline({"stages": [{"name": "talker", "kind": "ar", "model": "talker",
                                       "engine": {"kv_cache_dtype": "bfloat16"}}]})
    assert engine_config(spec.stages[0], "cpu", torch.float32, 4096).cache_dtype == torch.bfloat16
    with pytest.raises(ConfigError, match=r"engine.kv_cache_dtype: must be one of"):
        parse_pipeline({"stages": [{"name": "t", "kind": "ar", "model": "t", "engine": {"kv_cache_dtype": "int4"}}]})
    over = apply_overrides(load_preset(TTS_PRESET), StageOverrides(kv_cache_dtype="bfloat16"))
    assert [s.engine.kv_cache_dtype for s in over.stages] == ["bfloat16", "auto"]  # the codec keeps no KV
    auto = engine_config(load_preset(TTS_PRESET).stages[0], "cpu", torch.float32, 4096)
    assert auto.kv_cache_dtype is None and auto.cache_dtype == torch.float32


def test_another_kv_dtype_is_cpu_only() -> None:
    check_kv_dtype(config(kv_cache_dtype=torch.bfloat16), tensor_parallel=False)
    with pytest.raises(ValueError, match="CPU stage without tensor parallelism"):
        check_kv_dtype(config(kv_cache_dtype=torch.bfloat16, device="cuda"), tensor_parallel=False)
    with pytest.raises(ValueError, match="CPU stage without tensor parallelism"):
        check_kv_dtype(config(kv_cache_dtype=torch.bfloat16), tensor_parallel=True)


def test_a_pool_smaller_than_max_model_len_ends_contexts_where_it_is_full() -> None:
    """A default budget under a large model may hold less than max_model_len: a lone request stops with the pool
    full (length), not preempted and recomputed for ever."""
    from omnistage.engine import FinishReason

    engine = make_engine(ToyLM(), config(num_blocks=5, enable_prefix_caching=False))  # 4 blocks of 4: 16 tokens
    engine.add_request(requests(prompts(97, [6]), SamplingParams(temperature=0.0, max_tokens=100,
                                                                  ignore_eos=True))[0])
    outputs = engine.run_until_done()
    assert sum(len(o.new_token_ids) for o in outputs) == 16 - 6
    assert outputs[-1].finish_reason == FinishReason.LENGTH


def _rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="reads Linux's /proc")
def test_a_cpu_pool_takes_memory_only_for_the_blocks_written() -> None:
    """A 512 MiB pool costs the process nothing until written, then about what was written."""
    from omnistage.runner.ar_runner import lazily_zeroed

    before = _rss_mib()
    cache = lazily_zeroed((2, 4096, 16, 8, 128), torch.float32)  # 512 MiB
    assert cache.untyped_storage().nbytes() == 512 << 20 and _rss_mib() - before < 32
    assert not cache[:, 100:200].any()  # reads as zeros
    cache[:, :256] = 1.0  # 256 of 4096 blocks: 32 MiB
    assert 24 < _rss_mib() - before < 96
