"""Where the stages go: the smallest thinker tensor-parallel size whose placement fits, and each stage's share.

Devices are ``NxSIZE`` GPUs (``2x48GiB``) or one ``cpu:SIZE``. Of each GPU, ``utilization`` (0.9, vLLM's
default) is usable. The thinker's ranks take devices ``0..tp-1`` (rank 0 on device 0 holds the embeddings, heads
and encoders besides its shards); the talker and code2wav each go, whole, to the device with the most room left.
A placement fits when every device holds its stages' weights, activation peaks and, for each autoregressive
stage, the KV cache of one request of ``max_model_len`` tokens. What is left on a device is then split between
its autoregressive stages in proportion to those minimum KV sizes (each gets the same multiple of its minimum),
and a stage's ``gpu_memory_utilization`` is (weights + activation peak + KV share) / device size: what
``serve`` takes out of the device for it (:func:`omnistage.engine.kv_sizing.gpu_kv_budget`). On a CPU the KV
share is written as ``kv_cache_memory``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from omnistage.config.memory import parse_bytes
from omnistage.tools.plan.footprint import StageFootprint

_GPUS = re.compile(r"^(\d+)x(.+)$")


class NoFit(ValueError):
    """Nothing fits: the message says what each try was short of."""


@dataclass(frozen=True)
class Devices:
    kind: str  # cuda or cpu
    count: int
    size: int  # bytes each

    @classmethod
    def parse(cls, text: str) -> Devices:
        """``2x48GiB``, ``1x80GiB`` or ``cpu:64GiB``."""
        if text.startswith("cpu:"):
            return cls("cpu", 1, parse_bytes(text.removeprefix("cpu:")))
        match = _GPUS.match(text)
        if match is None or int(match[1]) < 1:
            raise ValueError(f"--devices wants NxSIZE (e.g. 2x48GiB) or cpu:SIZE (e.g. cpu:64GiB), got {text!r}")
        return cls("cuda", int(match[1]), parse_bytes(match[2]))


@dataclass(frozen=True)
class StagePlan:
    name: str
    devices: tuple[int, ...]  # one per tensor-parallel rank
    weight_bytes: int  # rank 0's
    activation_peak: int
    kv_bytes_per_token: int  # per rank
    min_kv_bytes: int
    kv_bytes: int  # the share given
    utilization: float  # of its (rank 0's) device

    @property
    def tensor_parallel_size(self) -> int:
        return len(self.devices)


@dataclass(frozen=True)
class Placement:
    devices: Devices
    usable: int  # bytes of each device the stages may use
    stages: tuple[StagePlan, ...]


@dataclass(frozen=True)
class _Need:
    name: str
    ranks: tuple[int, ...]
    weights: tuple[int, ...]  # per rank
    activation: int
    kv_per_token: int
    min_kv: int


def _needs(fp: dict[str, StageFootprint], quantized: dict[str, bool], dtype_bytes: int, tp: int,
           max_model_len: int, device: str) -> list[_Need]:
    needs = []
    for name, f in fp.items():
        ranks = tp if name == "thinker" else 1
        weights = tuple(f.weight_bytes(dtype_bytes, quantized.get(name, False), ranks, r, device)
                        for r in range(ranks))
        kv = -(-f.kv_bytes_per_token // ranks)
        needs.append(_Need(name, tuple(range(ranks)), weights, f.activation_peak, kv, kv * max_model_len))
    return needs


def _valid_tp(tp: int, heads: tuple[int, int, int]) -> bool:
    num_heads, kv_heads, moe_intermediate = heads
    return num_heads % tp == 0 and (kv_heads % tp == 0 or tp % kv_heads == 0) and moe_intermediate % tp == 0


def place(fp: dict[str, StageFootprint], devices: Devices, quantized: dict[str, bool], dtype_bytes: int,
          max_model_len: int, heads: tuple[int, int, int], utilization: float = 0.9) -> Placement:
    """The placement with the smallest thinker tensor-parallel size that fits; :class:`NoFit` if none does.
    ``heads``: the thinker's (attention heads, KV heads, moe intermediate size), which bound its TP size."""
    usable = int(devices.size * utilization) if devices.kind == "cuda" else devices.size
    short = []
    tp = 1
    while tp <= devices.count:
        if _valid_tp(tp, heads):
            needs = _needs(fp, quantized, dtype_bytes, tp, max_model_len, devices.kind)
            placed = _assign(needs, devices.count, usable)
            if isinstance(placed, dict):
                return Placement(devices, usable, _shares(needs, placed, devices, usable))
            short.append(f"thinker tensor_parallel_size={tp}: {placed}")
        tp *= 2
    raise NoFit("no placement fits: " + "; ".join(short) + ". Try --quantization int8 (or an FP8 checkpoint), "
                "a smaller --max-model-len, or more devices")


def _assign(needs: list[_Need], count: int, usable: int) -> dict[str, tuple[int, ...]] | str:
    """Stage -> devices of its ranks, or why it does not fit."""
    used = [0] * count
    placed: dict[str, tuple[int, ...]] = {}
    for need in needs:  # the thinker first: its ranks take devices 0..tp-1
        if len(need.ranks) > 1 or need.name == "thinker":
            devices = tuple(range(len(need.ranks)))
        else:
            devices = (min(range(count), key=lambda d: used[d]),)
        for rank, device in enumerate(devices):
            used[device] += need.weights[rank] + need.activation + need.min_kv
        placed[need.name] = devices
    over = [d for d in range(count) if used[d] > usable]
    if over:
        return ", ".join(f"device {d} needs {used[d] / 2**30:.2f} GiB of {usable / 2**30:.2f} GiB usable"
                         for d in over)
    return placed


def _shares(needs: list[_Need], placed: dict[str, tuple[int, ...]], devices: Devices,
            usable: int) -> tuple[StagePlan, ...]:
    """Each device's room left, split between its stages' KV caches in proportion to their minimums."""
    fixed = [0] * devices.count
    minimum = [0] * devices.count
    for need in needs:
        for rank, device in enumerate(placed[need.name]):
            fixed[device] += need.weights[rank] + need.activation
            minimum[device] += need.min_kv
    plans = []
    for need in needs:
        # A stage's share on each of its ranks' devices; the smallest is what all its ranks can allocate.
        shares = [need.min_kv * (usable - fixed[d]) // minimum[d] if minimum[d] else 0 for d in placed[need.name]]
        kv = min(shares)
        used = need.weights[0] + need.activation + kv
        plans.append(StagePlan(need.name, placed[need.name], need.weights[0], need.activation, need.kv_per_token,
                               need.min_kv, kv, used / devices.size))
    return tuple(plans)
