"""``omnistage plan --model DIR --devices 2x48GiB``: a memory plan and a stage config ``serve`` accepts.

Reads only ``config.json``. Prints, per stage, the weight bytes at the chosen precision, KV bytes per token and
the activation peak, then the placement (:mod:`omnistage.tools.plan.placement`); ``--out`` writes it as a stage
config (the preset with each stage's device, ``tensor_parallel_size``, ``quantization`` and
``gpu_memory_utilization`` or ``kv_cache_memory``). Exit 1 with the reason when nothing fits.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import yaml

from omnistage.config.memory import CPU_DEFAULT_KV_BYTES, format_bytes
from omnistage.config.pipeline import QUANTIZATIONS, parse_pipeline, per_stage
from omnistage.tools.plan.footprint import Workload, footprints
from omnistage.tools.plan.placement import Devices, NoFit, Placement, StagePlan, place
from omnistage.usage_error import UsageError

if TYPE_CHECKING:
    from omnistage.families.base import Family

DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}
KV_DTYPE_BYTES = {**DTYPE_BYTES, "fp8_e5m2": 1, "fp8_e4m3": 1}


def add_plan_parser(sub: argparse._SubParsersAction) -> None:
    plan = sub.add_parser("plan", help="per-stage memory and a placement that fits some devices (config only)")
    plan.add_argument("--model", required=True, help="checkpoint folder (only its config.json is read)")
    plan.add_argument("--devices", required=True, type=_devices, help="NxSIZE GPUs (2x48GiB) or cpu:SIZE")
    plan.add_argument("--quantization", type=_quantization, default=(),
                      help="int8, or per stage: thinker=int8 (an FP8 checkpoint's thinker counts 1 byte on GPUs)")
    plan.add_argument("--dtype", choices=sorted(DTYPE_BYTES), default=None,
                      help="weights' dtype (default bfloat16 on GPUs, float32 on a CPU)")
    plan.add_argument("--kv-cache-dtype", choices=["auto", *sorted(KV_DTYPE_BYTES)], default="auto",
                      help="what the KV caches store (auto: the weights' dtype; bfloat16 halves a CPU's)")
    plan.add_argument("--max-model-len", type=int, default=8192, help="tokens of one request's KV that must fit")
    plan.add_argument("--gpu-memory-utilization", type=float, default=0.9, help="usable fraction of each GPU")
    plan.add_argument("--out", default=None, help="write the placement as a stage config YAML here")
    plan.set_defaults(func=main)


def _devices(text: str) -> Devices:
    try:
        return Devices.parse(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _quantization(text: str) -> tuple[tuple[str, object], ...]:
    try:
        pairs = per_stage(text, str)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    for stage, value in pairs:
        if value not in QUANTIZATIONS or stage not in ("", "thinker", "talker"):
            raise argparse.ArgumentTypeError(f"--quantization: {stage or 'all'}={value} (int8 on thinker/talker)")
    return pairs


def precisions(folder: Path, pairs: tuple[tuple[str, object], ...], devices: Devices) -> dict[str, str]:
    """Each autoregressive stage's quantization: int8 where asked, ``fp8`` for an FP8 checkpoint's thinker on
    GPUs (a CPU dequantises it at load), else none. Stages not named here keep the dtype."""
    chosen = {stage: "none" for stage in ("thinker", "talker")}
    for stage, value in pairs:
        for name in ([stage] if stage else list(chosen)):
            chosen[name] = str(value)
    config = json.loads((folder / "config.json").read_text())
    if config.get("quantization_config") and devices.kind == "cuda":
        chosen["thinker"] = "fp8"
    return chosen


def _family(folder: Path) -> Family:
    from omnistage.families.registry import DEFAULT_REGISTRY  # here: the parser stays free of torch

    return DEFAULT_REGISTRY.for_folder(folder)


def make_plan(folder: Path, devices: Devices, pairs: tuple[tuple[str, object], ...] = (), dtype: str | None = None,
              max_model_len: int = 8192, utilization: float = 0.9,
              kv_cache_dtype: str = "auto") -> tuple[Placement, dict[str, str]]:
    dtype_bytes = DTYPE_BYTES[dtype or ("bfloat16" if devices.kind == "cuda" else "float32")]
    chosen = precisions(folder, pairs, devices)
    quantized = {stage: value != "none" for stage, value in chosen.items()}
    family = _family(folder)
    if family.hooks.footprints:  # a family that counts its own stages: none is tensor-parallel
        from omnistage.families.base import call_hook

        fp = call_hook(family.hooks.footprints, folder, dtype_bytes, KV_DTYPE_BYTES.get(kv_cache_dtype))
        return place(fp, devices, quantized, dtype_bytes, max_model_len, (1, 1, 1), utilization), chosen
    if family.name != "qwen3_omni":
        raise UsageError(f"omnistage plan does not count {family.name}'s stages yet (a family gives them with its "
                         f"footprints hook)")
    fp = footprints(folder, dtype_bytes, Workload(), KV_DTYPE_BYTES.get(kv_cache_dtype))
    text = json.loads((folder / "config.json").read_text())["thinker_config"]["text_config"]
    heads = (text["num_attention_heads"], text["num_key_value_heads"], text["moe_intermediate_size"])
    return place(fp, devices, quantized, dtype_bytes, max_model_len, heads, utilization), chosen


def stage_config(folder: Path, placement: Placement, chosen: dict[str, str], max_model_len: int,
                 kv_cache_dtype: str = "auto") -> dict:
    """The checkpoint's preset with the placement written in: what ``serve --stage-config`` takes."""
    family = _family(folder)
    data = yaml.safe_load(Path(family.preset(family.load_config(folder))).read_text())
    plans = {p.name: p for p in placement.stages}
    cuda = placement.devices.kind == "cuda"
    for stage in data["stages"]:
        plan = plans[stage["model"]]
        stage["device"] = f"cuda:{plan.devices[0]}" if cuda else "cpu"
        if stage["kind"] != "ar":
            continue
        stage["tensor_parallel_size"] = plan.tensor_parallel_size
        stage["quantization"] = "int8" if chosen.get(stage["model"]) == "int8" else "none"  # FP8: the checkpoint's
        engine = stage["engine"]
        engine["max_model_len"] = max_model_len
        engine.pop("num_kv_blocks", None)
        if kv_cache_dtype != "auto":
            engine["kv_cache_dtype"] = kv_cache_dtype
        if cuda:
            engine["gpu_memory_utilization"] = int(plan.utilization * 10_000) / 10_000  # rounded down
        else:
            engine["kv_cache_memory"] = plan.kv_bytes
    parse_pipeline(data)  # what serve will check: refuse to write what it would refuse
    return data


# The presets' KV block size: what the budget's blocks are counted in.
BLOCK_SIZE = 16


def kv_blocks(plan: StagePlan) -> tuple[int, int]:
    """Blocks of :data:`BLOCK_SIZE` tokens a stage's KV budget holds (the null block taken off), and their tokens."""
    if not plan.kv_bytes_per_token:
        return 0, 0
    blocks = max(plan.kv_bytes // (plan.kv_bytes_per_token * BLOCK_SIZE) - 1, 0)
    return blocks, blocks * BLOCK_SIZE


def format_plan(placement: Placement) -> str:
    lines = [f"{'stage':<9} {'devices':<10} {'tp':>2}  {'weights':>12}  {'KV/token':>10}  {'activations':>12}  "
             f"{'KV (min)':>12}  {'KV budget':>12}  {'KV blocks':>9}  {'KV tokens':>10}  utilization"]
    for p in placement.stages:
        devices = ",".join(str(d) for d in p.devices)
        blocks, tokens = kv_blocks(p)
        lines.append(f"{p.name:<9} {devices:<10} {p.tensor_parallel_size:>2}  {format_bytes(p.weight_bytes):>12}  "
                     f"{p.kv_bytes_per_token:>10}  {format_bytes(p.activation_peak):>12}  "
                     f"{format_bytes(p.min_kv_bytes):>12}  {format_bytes(p.kv_bytes):>12}  {blocks:>9}  "
                     f"{tokens:>10}  {p.utilization:.4f}")
    if placement.devices.kind == "cpu":
        lines.append(f"(without this plan's stage config, serve gives each CPU stage's KV cache "
                     f"{format_bytes(CPU_DEFAULT_KV_BYTES)} at most, or half the available memory, as vLLM's CPU "
                     f"backend: --kv-cache-memory changes it)")
    return "\n".join(lines)


def main(args: argparse.Namespace) -> int:
    folder = Path(args.model).expanduser()
    if not (folder / "config.json").is_file():
        from omnistage.families.registry import missing_checkpoint

        raise UsageError(missing_checkpoint(folder))  # plan reads config.json alone: no embedded names
    try:
        placement, chosen = make_plan(folder, args.devices, args.quantization, args.dtype, args.max_model_len,
                                      args.gpu_memory_utilization, args.kv_cache_dtype)
    except NoFit as exc:
        print(f"omnistage plan: {exc}", file=sys.stderr)
        return 1
    print(format_plan(placement))
    if args.out:
        config = stage_config(folder, placement, chosen, args.max_model_len, args.kv_cache_dtype)
        Path(args.out).write_text(yaml.safe_dump(config, sort_keys=False))
        print(f"stage config written to {args.out} (serve --stage-config {args.out})")
    return 0

