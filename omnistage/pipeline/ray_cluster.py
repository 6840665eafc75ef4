"""The Ray cluster a pipeline's replicas run on: joined (or started) when the runtime starts, left when it closes.

``ray.init`` runs only when this process is not already connected (a caller
that connected itself, e.g. a test or a notebook, keeps its connection and its
own ``ray.init`` options). Without an address Ray joins the cluster started on
this machine by ``ray start --head`` (or ``$RAY_ADDRESS``), else starts a local
one. Whoever called ``ray.init`` here calls ``ray.shutdown`` when the last
pipeline using that connection closes. A cluster that cannot be joined is a
:class:`RayJoinError` naming the address and the usual cause: Ray's token
authentication (docs/ray.md).
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


class RayJoinError(RuntimeError):
    """This process could not join the Ray cluster it was pointed at."""


def join_error_message(address: str | None, cause: BaseException) -> str:
    """One line: where, what Ray said, and how to pass the cluster's token (Ray 2.60 logs ``InvalidAuthToken``
    and then raises a bare ConnectionError when this process has no token for a head that requires one)."""
    where = f"the Ray cluster at {address}" if address else "the Ray cluster on this machine ($RAY_ADDRESS)"
    said = (str(cause).strip().splitlines() or [""])[0]
    return (f"cannot join {where} ({type(cause).__name__}: {said}). If its head uses token authentication "
            "(Ray 2.60 turns it on wherever a token exists, e.g. ~/.ray/auth_token), start this process with "
            "RAY_AUTH_MODE=token and the head's token (RAY_AUTH_TOKEN=..., or the file ~/.ray/auth_token; "
            "`ray get-auth-token` on the head prints it); otherwise check that `ray status` reaches the head from "
            "here (docs/ray.md)")


def _join(ray: ModuleType, address: str | None) -> None:
    try:
        ray.init(address=address)
    except (ConnectionError, TimeoutError, ray.exceptions.RayError) as exc:
        raise RayJoinError(join_error_message(address, exc)) from exc


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
                _join(ray, address)
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
