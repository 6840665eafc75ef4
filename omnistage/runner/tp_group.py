"""A tensor-parallel group of processes: torch.distributed collectives without process-wide state.

Each group is a standalone ``ProcessGroup`` object over a ``TCPStore`` that rank 0 hosts on a free port; nothing
calls ``init_process_group``, so a process may hold several groups (a test, an offline run of several stages)
and the default group stays untouched. Two groups share the store:

* ``cpu``: gloo, for the step announcements rank 0 sends and the other ranks wait on (a rank may wait there
  for hours while the server is idle, so its timeout is long: a dead peer shows as a closed connection, at once);
* ``device``: the all-reduces inside a forward and the step's float tensors: NCCL on CUDA, the same gloo group
  on a CPU.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass

import torch
import torch.distributed as dist

from omnistage.runner.device import bind_device

# Rank 0 waits this long for the other ranks to join at start-up (they join before loading any weights).
JOIN_TIMEOUT = datetime.timedelta(seconds=300)
# Collectives may wait this long: idle servers park the other ranks on a broadcast.
IDLE_TIMEOUT = datetime.timedelta(days=30)


@dataclass(frozen=True)
class GroupAddress:
    """Where the other ranks find rank 0's store (picklable, crosses into their processes)."""

    host: str
    port: int
    size: int


def host_store(size: int, host: str = "127.0.0.1") -> tuple[dist.Store, GroupAddress]:
    """Rank 0's store on a free port, and its address for the other ranks (start them, then make the group)."""
    store = dist.TCPStore(host, 0, size, True, timeout=JOIN_TIMEOUT, wait_for_workers=False)
    return store, GroupAddress(host, store.port, size)


class TPGroup:
    """One rank's handle on its group; made on every rank, it returns once all ranks have joined."""

    def __init__(self, store: dist.Store, rank: int, size: int, device: torch.device) -> None:
        self.rank, self.size, self.device = rank, size, device
        bind_device(device)  # NCCL binds its communicator, and every later launch goes, to the current device
        self._store = store  # the groups keep using it
        self.cpu = dist.ProcessGroupGloo(dist.PrefixStore("cpu", store), rank, size, IDLE_TIMEOUT)
        if device.type == "cuda":
            self.dev = dist.ProcessGroupNCCL(dist.PrefixStore("dev", store), rank, size)
        else:
            self.dev = self.cpu

    @classmethod
    def join(cls, address: GroupAddress, rank: int, device: torch.device) -> TPGroup:
        store = dist.TCPStore(address.host, address.port, address.size, False, timeout=JOIN_TIMEOUT)
        return cls(store, rank, address.size, device)

    def all_reduce(self, x: torch.Tensor) -> None:
        self.dev.allreduce([x]).wait()

    def broadcast_cpu(self, x: torch.Tensor) -> None:
        self.cpu.broadcast(x, 0).wait()

    def broadcast_device(self, x: torch.Tensor) -> None:
        self.dev.broadcast(x, 0).wait()
