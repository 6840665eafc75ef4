"""Binding a runner's thread to its CUDA device.

Tensors carry their device, but Triton launches, CUDA-graph captures, ``torch.cuda.synchronize()`` and the
current stream follow the thread's *current* device: without this a stage on ``cuda:1`` (or a tensor-parallel
rank) would launch its kernels and capture its graphs on device 0's stream. A replica builds its runner and steps
it in the same thread, so binding once at construction covers its steps.
"""

from __future__ import annotations

import torch


def bind_device(device: torch.device | str) -> None:
    """Makes ``device`` the calling thread's current CUDA device; nothing for a CPU device or a bare ``cuda``
    (the current one already)."""
    device = torch.device(device)
    if device.type == "cuda" and device.index is not None:
        torch.cuda.set_device(device)
