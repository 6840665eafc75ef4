"""``omnistage bench engine``: the JSON it writes, and the batching it measures (counted in steps, not timed)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from omnistage.entrypoints.cli import main


@pytest.fixture(scope="module")
def tiny_thinker(tiny_dir: Path):
    import torch

    from omnistage.tools.bench.engine import load_stage

    return load_stage(str(tiny_dir), "thinker", "cpu", torch.float32)


def test_cli_writes_results_json(tiny_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "bench.json"
    code = main(["bench", "engine", "--model", str(tiny_dir), "--stage", "thinker", "--batch", "1,2",
                 "--output-len", "4", "--repeats", "1", "--json", str(out)])
    assert code == 0
    results = json.loads(out.read_text())["results"]
    assert [r["batch"] for r in results] == [1, 2] and all(r["tokens_per_s"] > 0 for r in results)
    assert "tokens/s" in capsys.readouterr().out
    assert main(["bench", "engine", "--model", str(tiny_dir), "--stage", "talker", "--batch", "2",
                 "--output-len", "3", "--repeats", "1"]) == 0


def _steps_to_finish(stage, batch: int, output_len: int = 32) -> int:  # noqa: ANN001
    import torch

    from omnistage.engine import EngineConfig, EngineCore
    from omnistage.runner import ARModelRunner
    from omnistage.sampling_params import SamplingParams

    config = EngineConfig(block_size=16, num_blocks=64, max_num_seqs=16, max_num_batched_tokens=256,
                          max_model_len=64, enable_prefix_caching=False)
    core = EngineCore(ARModelRunner(stage.model, config, hook=stage.make_hook()), config)
    params = SamplingParams(temperature=0.0, max_tokens=output_len, ignore_eos=True)
    gen = torch.Generator().manual_seed(0)
    for i in range(batch):
        core.add_request(stage.make_request(f"r{i}", 16, params, gen))
    steps = 0
    while core.has_unfinished_requests():
        core.step()
        steps += 1
    return steps


def test_a_batch_of_16_decodes_in_the_steps_of_one(tiny_thinker) -> None:  # noqa: ANN001
    """What makes batch 16 fast (the benchmark times it; a test only counts): the 16 requests prefill in one step
    and then decode together, one token each per step, so they finish in as many engine steps as one request."""
    assert _steps_to_finish(tiny_thinker, 16) == _steps_to_finish(tiny_thinker, 1) == 32


def test_sampled_runs_generate_the_same_token_count(tiny_dir: Path, tmp_path: Path) -> None:
    """--temperature 0.9 (hotpath's sampling) runs the same fixed lengths as greedy, so their ratios compare."""
    for temperature in ("0", "0.9"):
        out = tmp_path / f"bench-{temperature}.json"
        assert main(["bench", "engine", "--model", str(tiny_dir), "--stage", "thinker", "--batch", "1,3",
                     "--output-len", "5", "--repeats", "1", "--temperature", temperature, "--json", str(out)]) == 0
        assert [r["num_tokens"] for r in json.loads(out.read_text())["results"]] == [5, 15]


def test_context_lens_write_step_ms(tiny_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``--context-lens``: the batch decodes from its prompts up to each length, and the JSON maps each length
    to the decode step's milliseconds there (timed, so only their presence and sign are checked)."""
    out = tmp_path / "context.json"
    assert main(["bench", "engine", "--model", str(tiny_dir), "--batch", "3", "--context-lens", "40,20",
                 "--steps", "2", "--repeats", "1", "--kv-cache-dtype", "bfloat16", "--json", str(out)]) == 0
    payload = json.loads(out.read_text())
    assert payload["batch"] == 3 and payload["kv_cache_dtype"] == "bfloat16"
    assert list(payload["step_ms"]) == ["20", "40"] and all(ms > 0 for ms in payload["step_ms"].values())
    assert "context     40" in capsys.readouterr().out
    with pytest.raises(ValueError, match="exceed the prompt"):
        main(["bench", "engine", "--model", str(tiny_dir), "--context-lens", "16", "--repeats", "1"])

