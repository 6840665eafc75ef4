"""Rank 0 of a stage's tensor-parallel group: starts the other ranks and leads every decoder forward.

A stage replica whose config says ``tensor_parallel_size: N`` keeps everything of its stage in its own process
(scheduler, runner, sampling, media encoders, embeddings, heads, rank 0's shards) and starts ``N - 1`` rank
processes (``python -m omnistage.runner.tp_worker``) that hold only their shards of the decoder layers and their
part of the KV cache. As vLLM's multiprocess executor does, rank 0 sends each forward's inputs to the others
(:mod:`omnistage.runner.tp_step`) and then runs it; inside, the layers meet in all-reduces. The orchestrator and
the launcher still see one replica.

A rank that dies, or a forward that fails half way, leaves the group out of step: the leader then stops the
other ranks and raises :class:`TensorParallelLost`, which ends the replica (it is restarted with fresh ranks).
CUDA graphs are not captured under tensor parallelism (the other ranks would have to capture and replay theirs
in step): rank 0 runs eagerly.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import weakref
from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch

from omnistage.layers.attention.context import get_forward_context
from omnistage.layers.parallel import TensorParallel
from omnistage.layers.rotary import Rotation
from omnistage.models.decoder import Deepstack
from omnistage.runner.tp_group import GroupAddress, TPGroup, host_store
from omnistage.runner.tp_step import DecoderCall, Op, send_call, send_op

STOP_WAIT_S = 10.0


class TensorParallelLost(BaseException):
    """The group lost a rank or fell out of step. Not an ``Exception``: a replica fails a batch's requests and
    goes on after those, but this group cannot go on, so the replica must end (and be restarted)."""


@dataclass(frozen=True)
class RankSpec:
    """Everything a rank process needs (sent as JSON on its command line)."""

    loader: str  # "module:function" (folder, device, dtype, tp, quantization) -> the rank's Decoder
    model_dir: str
    device: str
    dtype: str
    quantization: str
    num_threads: int
    address: GroupAddress
    rank: int
    parent_pid: int

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> RankSpec:
        data = json.loads(text)
        return cls(**{**data, "address": GroupAddress(**data["address"])})


def rank_device(device: torch.device, rank: int) -> torch.device:
    """Rank ``r`` of a stage placed on ``cuda:k`` runs on ``cuda:k+r``; CPU ranks share the CPU."""
    if device.type != "cuda":
        return device
    return torch.device("cuda", (device.index or 0) + rank)


class TPExecutor:
    """Starts ranks ``1..size-1`` and makes the group (which waits for them to join, before they load weights)."""

    def __init__(self, size: int, loader: str, model_dir: str, device: torch.device, dtype: torch.dtype,
                 quantization: str = "none") -> None:
        if size < 2:
            raise ValueError(f"a tensor-parallel executor needs 2 or more ranks, not {size}")
        store, address = host_store(size)
        self._procs: list[subprocess.Popen] = []
        for rank in range(1, size):
            spec = RankSpec(loader, str(model_dir), str(rank_device(device, rank)), str(dtype).removeprefix("torch."),
                            quantization, torch.get_num_threads(), address, rank, os.getpid())
            self._procs.append(subprocess.Popen([sys.executable, "-m", "omnistage.runner.tp_worker",
                                                 spec.to_json()], stdin=subprocess.DEVNULL))
        self._reaper = weakref.finalize(self, _kill, self._procs)
        try:
            self.group = TPGroup(store, 0, size, device)
        except Exception:
            self._reaper()
            raise
        self.tp = TensorParallel(0, size, self.group)
        self._lost: str | None = None

    @property
    def size(self) -> int:
        return self.group.size

    def run(self, forward: Callable[..., tuple[torch.Tensor, torch.Tensor | None]], inputs_embeds: torch.Tensor,
            positions: torch.Tensor, deepstack: Deepstack | None, capture_layer: int | None,
            rotation: Rotation | None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The decoder's forward on every rank (``Decoder.leader``)."""
        self._check()
        ctx = get_forward_context()
        call = DecoderCall(inputs_embeds, positions, ctx.meta, ctx.kv_caches is not None,
                           None if deepstack is None else deepstack.rows,
                           None if deepstack is None else deepstack.features)
        try:
            send_call(self.group, call)
            return forward(inputs_embeds, positions, deepstack, capture_layer, rotation)
        except Exception as exc:
            self._lose(f"a tensor-parallel forward failed ({type(exc).__name__}: {exc})")
            raise TensorParallelLost(self._lost) from exc

    def allocate_kv(self, num_blocks: int, block_size: int) -> None:
        """The other ranks allocate their part of the KV pool: the same blocks, their share of the KV heads."""
        self._check()
        try:
            send_op(self.group, Op.ALLOC_KV, num_blocks, block_size)
        except Exception as exc:
            self._lose(f"a tensor-parallel rank did not start ({type(exc).__name__}: {exc})")
            raise TensorParallelLost(self._lost) from exc

    def close(self) -> None:
        """Stops the other ranks (at once when the group is already broken)."""
        if self._lost is None:
            try:
                send_op(self.group, Op.STOP)
            except Exception:  # noqa: BLE001 - a rank already gone: killed below
                pass
            for proc in self._procs:
                try:
                    proc.wait(STOP_WAIT_S)
                except subprocess.TimeoutExpired:
                    pass
        self._reaper()

    def _check(self) -> None:
        if self._lost is not None:
            raise TensorParallelLost(self._lost)
        dead = sum(proc.poll() is not None for proc in self._procs)
        if dead:
            self._lose(f"{dead} tensor-parallel rank process(es) exited")
            raise TensorParallelLost(self._lost)

    def _lose(self, reason: str) -> None:
        self._lost = reason
        self._reaper()


def _kill(procs: list[subprocess.Popen]) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
    for proc in procs:
        try:
            proc.wait(STOP_WAIT_S)
        except subprocess.TimeoutExpired:
            pass
