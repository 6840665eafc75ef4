"""The Ray cluster a pipeline's replicas run on: joined (or started) when the runtime starts, left when it closes.

``ray.init`` runs only when this process is not already connected (a caller
that connected itself, e.g. a test or a notebook, keeps its connection and its
own ``ray.init`` options). Without an address Ray joins the cluster started on
this machine by ``ray start --head`` (or ``$RAY_ADDRESS``), else starts a local
one. Whoever called ``ray.init`` here calls ``ray.shutdown`` when the last
pipeline using that connection closes.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from types import ModuleType

_LOCK = threading.Lock()
_OWNED_USERS = 0  # pipelines sharing a connection this module opened


def import_ray() -> ModuleType:
    try:
        import ray
    except ImportError as exc:
        raise RuntimeError("the Ray backend needs Ray: pip install 'omnistage[ray]'") from exc
    return ray


@dataclass(frozen=True)
class RayCluster:
    """This process's place in the cluster: replicas compare ``node_id`` with their own to know whether they
    share this machine, and reach the orchestrator's sockets at ``node_ip``."""

    node_id: str
    node_ip: str
    owned: bool  # this module called ray.init for it

    @classmethod
    def connect(cls, address: str | None = None) -> RayCluster:
        global _OWNED_USERS
        ray = import_ray()
        with _LOCK:
            owned = _OWNED_USERS > 0 or not ray.is_initialized()
            if not ray.is_initialized():
                ray.init(address=address)
            if owned:
                _OWNED_USERS += 1
        return cls(ray.get_runtime_context().get_node_id(), ray.util.get_node_ip_address(), owned)

    def close(self) -> None:
        global _OWNED_USERS
        if not self.owned:
            return
        ray = import_ray()
        with _LOCK:
            _OWNED_USERS -= 1
            if _OWNED_USERS == 0 and ray.is_initialized():
                ray.shutdown()
