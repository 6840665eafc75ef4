"""``omnistage plan``: its numbers for the real Qwen3-Omni-30B-A3B config equal the hand calculation of
docs/memory_plan.md; on made checkpoints its weight bytes equal the stored tensors'; it writes stage configs
``serve`` parses and refuses clearly when nothing fits. Config only: no weights are read by plan."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from safetensors import safe_open

from omnistage.config.pipeline import parse_pipeline
from omnistage.entrypoints.cli import main as cli_main
from omnistage.tools.plan.cli import make_plan
from omnistage.tools.plan.footprint import footprints
from omnistage.tools.plan.placement import Devices
from tests.tools.real_config import write_real_config

GIB = 2**30
# The hand calculation (docs/memory_plan.md), bf16 = 2 bytes.
ATTN_T = 2048 * 4096 + 2 * 2048 * 512 + 4096 * 2048  # q, k, v, o
EXPERTS_T = 128 * 3 * 768 * 2048
THINKER_SHARDED = 48 * (ATTN_T + EXPERTS_T)  # 29,896,998,912
THINKER_ROWS = 48 * (4096 + 512 + 512 + 2048 + 128 * (2 * 768 + 2048))
THINKER_REPLICATED = 48 * (2 * 2048 + 2 * 128 + 128 * 2048)  # norms, q/k norms, router
THINKER_REST = 2 * 152064 * 2048 + 2048 + 1_186_558_576  # embeddings, lm_head, final norm, encoders (counted)
TALKER_Q = 20 * (1024 * 2048 + 2 * 1024 * 256 + 2048 * 1024 + 128 * 3 * 384 * 1024 + 3 * 768 * 1024) \
    + 5 * (1024 * 2048 + 2 * 1024 * 1024 + 2048 * 1024 + 3 * 3072 * 1024)
THINKER_W = 2 * (THINKER_SHARDED + THINKER_REPLICATED + THINKER_REST)  # 63,438,410,976
TALKER_W = 6_649_192_960
CODE2WAV_W = 432_033_154
THINKER_ACT = 2048 * (2 * 2048 + 40 * 128 + 2 * 8 * 768) * 2 + 32 * 152064 * 4
TALKER_ACT = 2048 * (2 * 1024 + 20 * 128 + 2 * 6 * 384) * 2 + 32 * 3072 * 4
CODE2WAV_ACT = 2 * 32 * 50 * (96 * 4 * 480) * 2
KV_T, KV_TALKER = 2 * 48 * 4 * 128 * 2, 2 * 20 * 2 * 128 * 2


@pytest.fixture(scope="module")
def real_dir(tiny_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_real_config(tiny_dir, tmp_path_factory.mktemp("real"))


def test_footprints_of_the_real_config_match_the_hand_calculation(real_dir: Path) -> None:
    fp = footprints(real_dir, 2)
    thinker = fp["thinker"].params
    assert (thinker.quantizable, thinker.quantizable_rows, thinker.replicated) == \
        (THINKER_SHARDED, THINKER_ROWS, THINKER_REPLICATED)
    assert thinker.rest == THINKER_REST and fp["talker"].params.quantizable == TALKER_Q
    assert [fp[s].weight_bytes(2, False) for s in ("thinker", "talker", "code2wav")] == \
        [THINKER_W, TALKER_W, CODE2WAV_W]
    assert fp["thinker"].weight_bytes(2, True) == THINKER_SHARDED + 4 * THINKER_ROWS + \
        2 * (THINKER_REPLICATED + THINKER_REST)  # int8: 1 byte a weight, a float32 scale a row
    assert (fp["thinker"].kv_bytes_per_token, fp["talker"].kv_bytes_per_token) == (KV_T, KV_TALKER)
    assert [fp[s].activation_peak for s in ("thinker", "talker", "code2wav")] == \
        [THINKER_ACT, TALKER_ACT, CODE2WAV_ACT]


@pytest.mark.parametrize(("devices", "tp", "where", "utilization"), [
    ("1x80GiB", 1, {"thinker": (0,), "talker": (0,), "code2wav": (0,)}, {"thinker": 0.7924, "talker": 0.0888}),
    ("2x48GiB", 2, {"thinker": (0, 1), "talker": (1,), "code2wav": (0,)}, {"thinker": 0.7852, "talker": 0.1849}),
    ("1x141GiB", 1, {"thinker": (0,), "talker": (0,), "code2wav": (0,)}, {"thinker": 0.7718, "talker": 0.1175}),
])
def test_placements_of_the_real_config(real_dir: Path, devices: str, tp: int, where: dict,
                                       utilization: dict) -> None:
    placement, _ = make_plan(real_dir, Devices.parse(devices))
    plans = {p.name: p for p in placement.stages}
    assert {name: p.devices for name, p in plans.items()} == where
    assert plans["thinker"].tensor_parallel_size == tp
    rank0 = THINKER_W if tp == 1 else THINKER_SHARDED + 2 * (THINKER_REPLICATED + THINKER_REST)
    assert plans["thinker"].weight_bytes == rank0
    for name, expected in utilization.items():
        assert plans[name].utilization == pytest.approx(expected, abs=1e-4)
    rank1 = THINKER_SHARDED + 2 * THINKER_REPLICATED  # a rank other than 0: its shards and the norms/routers
    for device in range(Devices.parse(devices).count):  # each device's stages use at most its usable 90%
        used = sum((p.weight_bytes if p.devices[0] == device else rank1) + p.activation_peak + p.kv_bytes
                   for p in plans.values() if device in p.devices)
        assert used <= placement.usable
        if tp == 1:  # one device: all of it given out, less rounding
            assert used >= placement.usable - 2


@pytest.mark.parametrize("name", ["tiny", "medium"])
def test_weight_bytes_equal_the_stored_tensors(name: str, tiny_dir: Path, medium_dir: Path) -> None:
    folder = tiny_dir if name == "tiny" else medium_dir
    fp = footprints(folder, 4)
    stored = dict.fromkeys(fp, 0)
    with safe_open(str(folder / "model.safetensors"), "pt") as f:
        for key in f.keys():
            sl = f.get_slice(key)
            stored[key.split(".", 1)[0]] += 4 * int(__import__("math").prod(sl.get_shape()))
    assert {s: fp[s].weight_bytes(4, False) for s in fp} == stored


def test_writes_a_stage_config_serve_accepts(real_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "plan.yaml"
    assert cli_main(["plan", "--model", str(real_dir), "--devices", "2x48GiB", "--out", str(out)]) == 0
    data = yaml.safe_load(out.read_text())
    spec = parse_pipeline(data)
    thinker, talker, code2wav = spec.stages
    assert (thinker.tensor_parallel_size, thinker.device, talker.device, code2wav.device) == \
        (2, "cuda:0", "cuda:1", "cuda:0")
    assert thinker.engine.gpu_memory_utilization == pytest.approx(0.7852, abs=1e-4)
    cpu = tmp_path / "cpu.yaml"
    assert cli_main(["plan", "--model", str(real_dir), "--devices", "cpu:128GiB", "--quantization", "thinker=int8",
                     "--out", str(cpu)]) == 0
    stages = parse_pipeline(yaml.safe_load(cpu.read_text())).stages
    assert stages[0].quantization == "int8" and stages[0].engine.kv_cache_memory > 8192 * KV_T * 2


def test_refuses_clearly_when_nothing_fits(real_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main(["plan", "--model", str(real_dir), "--devices", "1x48GiB"]) == 1
    err = capsys.readouterr().err
    assert "no placement fits" in err and "--quantization int8" in err and "GiB" in err
    assert cli_main(["plan", "--model", str(real_dir), "--devices", "1x48GiB", "--quantization", "thinker=int8"]) == 0


def test_reports_each_stage_kv_budget_blocks_and_tokens(real_dir: Path, tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    """The KV budget a CPU plan gives, in blocks of 16 tokens and the tokens they hold; a bf16 cache halves the
    bytes of a token, and the written stage config asks serve for it."""
    from omnistage.tools.plan.cli import kv_blocks

    devices = Devices.parse("cpu:128GiB")
    fp32, _ = make_plan(real_dir, devices, (("thinker", "int8"),))
    bf16, _ = make_plan(real_dir, devices, (("thinker", "int8"),), kv_cache_dtype="bfloat16")
    thinker32, thinker16 = fp32.stages[0], bf16.stages[0]
    assert thinker32.kv_bytes_per_token == 2 * KV_T and thinker16.kv_bytes_per_token == KV_T  # fp32 weights on CPU
    blocks, tokens = kv_blocks(thinker32)
    assert blocks == thinker32.kv_bytes // (2 * KV_T * 16) - 1 and tokens == 16 * blocks >= 8192
    assert kv_blocks(fp32.stages[2]) == (0, 0)  # code2wav keeps no KV
    out = tmp_path / "bf16.yaml"
    assert cli_main(["plan", "--model", str(real_dir), "--devices", "cpu:128GiB", "--quantization", "thinker=int8",
                     "--kv-cache-dtype", "bfloat16", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "KV budget" in printed and "KV blocks" in printed and "KV tokens" in printed and "4.00 GiB" in printed
    thinker_line = next(line for line in printed.splitlines() if line.startswith("thinker"))
    assert f" {kv_blocks(thinker16)[1]} " in thinker_line
    stages = parse_pipeline(yaml.safe_load(out.read_text())).stages
    assert [s.engine.kv_cache_dtype for s in stages] == ["bfloat16", "bfloat16", "auto"]
