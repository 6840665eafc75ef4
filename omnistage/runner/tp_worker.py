"""A tensor-parallel rank other than 0: its shards of a stage's decoder, run on what rank 0 sends.

``python -m omnistage.runner.tp_worker SPEC_JSON`` (started by :class:`omnistage.runner.tp_executor.TPExecutor`).
The rank joins the group first (rank 0 waits for that), then loads its shards through the spec's loader, then
serves: each FORWARD runs the decoder's layers in a forward context with this rank's KV caches; ALLOC_KV makes
those caches; STOP ends the process. It exits with its parent too (the replica that started it).
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
import time

import torch

from omnistage.importing import resolve
from omnistage.layers.attention.context import ForwardContext, forward_context
from omnistage.layers.parallel import TensorParallel
from omnistage.models.decoder import Decoder, Deepstack
from omnistage.runner.ar_runner import default_backend
from omnistage.runner.tp_executor import RankSpec
from omnistage.runner.tp_group import TPGroup
from omnistage.runner.tp_step import Op, recv_call, recv_header

PARENT_POLL_S = 0.5
PR_SET_PDEATHSIG = 1


def _die_with_parent(parent_pid: int) -> None:
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        except OSError:
            pass  # the polling thread below still covers it

    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(PARENT_POLL_S)
        os._exit(1)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def load_shard(spec: RankSpec, tp: TensorParallel) -> Decoder:
    loader = resolve(spec.loader)
    return loader(spec.model_dir, torch.device(spec.device), getattr(torch, spec.dtype), tp, spec.quantization)


@torch.inference_mode()
def serve(decoder: Decoder, group: TPGroup, dtype: torch.dtype) -> None:
    """Runs what rank 0 sends until STOP."""
    device = group.device
    caches: list[torch.Tensor] | None = None
    backend = default_backend(device)
    while True:
        header = recv_header(group)
        op = Op(int(header[0]))
        if op is Op.STOP:
            return
        if op is Op.ALLOC_KV:
            num_blocks, block_size = int(header[1]), int(header[2])
            layers, kv_heads, head_dim = decoder.kv_cache_spec()
            shape = (2, num_blocks, block_size, kv_heads, head_dim)
            caches = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(layers)]
            backend = default_backend(device, block_size)
            continue
        call = recv_call(group, header, dtype)
        deepstack = None if call.deepstack_rows is None else Deepstack(call.deepstack_rows, call.deepstack_features)
        with forward_context(ForwardContext(call.meta, backend, caches if call.has_cache else None)):
            decoder.run_layers(call.inputs_embeds, call.positions, deepstack)


def main(argv: list[str]) -> int:
    spec = RankSpec.from_json(argv[0])
    _die_with_parent(spec.parent_pid)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the process group; rank 0 decides
    torch.set_num_threads(spec.num_threads)
    group = TPGroup.join(spec.address, spec.rank, torch.device(spec.device))
    decoder = load_shard(spec, TensorParallel(spec.rank, spec.address.size, group))
    serve(decoder, group, getattr(torch, spec.dtype))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
