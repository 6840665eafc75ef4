"""Stage replicas as Ray actors: the same replica loop, on whichever node the stage's placement picks.

The actor connects to the orchestrator's TCP sockets, so the orchestrator and
the request flows are the same as for local processes. Tensors travel in the
message frames, except between ends on one machine, which use the pipeline's
connector (shared memory by default). The actor's one ``run`` call is the
replica's lifetime: once its result is ready the replica has ended (it
returned after a ``Shutdown``, or the actor died: killed, out of memory, its
node lost), and ``is_alive`` says so exactly as for a dead local process, so
the orchestrator fails the requests it held and starts a new actor. Ray's own
actor restarts stay off: a restart needs fresh sockets and the orchestrator's
bookkeeping. Actors belong to this driver, so Ray ends them if it exits.
"""

from __future__ import annotations

import math
import os
from dataclasses import replace

import ray
import zmq
from ray.exceptions import ActorUnavailableError, RayActorError

from omnistage.config.pipeline import ConfigError, PlacementSpec, StageSpec
from omnistage.pipeline.connectors import make_connector
from omnistage.pipeline.launcher import ReplicaHandle, ReplicaLaunch
from omnistage.pipeline.replica import ReplicaLoop

KILL_WAIT_S = 5.0


class ReplicaActor:
    """The body of a replica on a Ray worker (what ``replica_main`` is to a local process)."""

    def node(self) -> tuple[str, str]:
        """Where Ray placed it: the node's id and address (named in the error its requests fail with)."""
        return ray.get_runtime_context().get_node_id(), ray.util.get_node_ip_address()

    def run(self, launch: ReplicaLaunch, orchestrator_node: str) -> None:
        if not ray.get_runtime_context().get_accelerator_ids().get("GPU"):
            # Ray leaves CUDA_VISIBLE_DEVICES alone for an actor that reserved no GPU: hide them (before torch
            # first touches CUDA), so such a stage's ``device: auto`` means the CPU, not a GPU it did not reserve.
            os.environ["CUDA_VISIBLE_DEVICES"] = ""
        import torch

        torch.set_num_threads(launch.num_threads)
        os.nice(launch.nice)
        same_host = ray.get_runtime_context().get_node_id() == orchestrator_node
        store = make_connector(launch.connector if same_host else "frames", launch.pipeline_id)
        # Peers reach this replica on its own node (the orchestrator's host is another machine's address).
        addresses = replace(launch.addresses, peer=f"tcp://{_node_host()}:*")
        ctx = zmq.Context()
        try:
            ReplicaLoop(launch.factory, ctx, addresses, store, os.getpid(), launch.payloads, same_host,
                        timed=launch.timed, stream_interval_s=launch.stream_interval_s).run()
        finally:
            ctx.destroy(linger=0)


def _node_host() -> str:
    """This node's address as other nodes reach it (bracketed when IPv6, as zmq takes it)."""
    ip = ray.util.get_node_ip_address()
    return f"[{ip}]" if ":" in ip else ip


_REMOTE_ACTOR = ray.remote(ReplicaActor)


def actor_options(stage: StageSpec, path: str = "placement") -> dict[str, object]:
    """The stage's placement as Ray's actor options (``ActorClass.options`` keywords), checked by Ray now,
    before any replica starts; errors name ``path`` (the placement's place in the stage config)."""
    placement = stage.placement
    if stage.device == "cuda" and placement.num_gpus == 0:
        raise ConfigError(f"{path}.num_gpus: device 'cuda' needs a GPU reserved on the Ray backend (num_gpus > 0)")
    options: dict[str, object] = {"num_cpus": placement.num_cpus, "num_gpus": placement.num_gpus,
                                  "max_restarts": 0}
    if placement.resources:
        options["resources"] = dict(placement.resources)
    if placement.node_labels:
        options["label_selector"] = dict(placement.node_labels)
    try:
        _REMOTE_ACTOR.options(**options)
    except ValueError as exc:
        raise ConfigError(f"{path}: {exc}") from exc
    return options


def replica_threads(placement: PlacementSpec) -> int:
    """Torch threads of a replica: the CPUs it reserved, at least one."""
    return max(math.ceil(placement.num_cpus), 1)


class RayReplica(ReplicaHandle):
    def __init__(self, launch: ReplicaLaunch, options: dict[str, object], orchestrator_node: str,
                 generation: int = 0) -> None:
        super().__init__(launch)
        self.options = options
        self.orchestrator_node = orchestrator_node
        self.generation = generation
        self.actor: ray.actor.ActorHandle | None = None
        self._done: ray.ObjectRef | None = None  # the result of ``run``: ready once the replica ended
        self._node: ray.ObjectRef | None = None  # ``node``'s answer, asked before ``run`` (an actor runs in order)

    @property
    def name(self) -> str:
        """The actor's name, so ``ray list actors`` tells replicas apart; the generation keeps a restart's free."""
        return f"omnistage-{self.launch.pipeline_id}-{self.launch.stage}-{self.launch.index}-{self.generation}"

    def start(self) -> None:
        self.actor = _REMOTE_ACTOR.options(name=self.name, **self.options).remote()
        self._node = self.actor.node.remote()
        self._done = self.actor.run.remote(self.launch, self.orchestrator_node)

    def respawn(self, launch: ReplicaLaunch) -> ReplicaHandle:
        self._release()  # an actor whose loop returned still holds its node's resources
        return RayReplica(launch, self.options, self.orchestrator_node, self.generation + 1)

    def is_alive(self) -> bool:
        if self._done is None or not ray.is_initialized():
            return False
        ready, _ = ray.wait([self._done], timeout=0, fetch_local=False)
        return not ready

    def join(self, timeout: float) -> bool:
        if self._done is not None and ray.is_initialized():
            ready, _ = ray.wait([self._done], timeout=timeout, fetch_local=False)
            if not ready:
                return False
        self._release()
        return True

    def kill(self) -> None:
        self._release()
        if self._done is not None and ray.is_initialized():
            ray.wait([self._done], timeout=KILL_WAIT_S, fetch_local=False)

    def _release(self) -> None:
        if self.actor is not None and ray.is_initialized():
            ray.kill(self.actor, no_restart=True)

    @property
    def exit_detail(self) -> str:
        if self._done is None or not ray.is_initialized():
            return "never started"
        try:
            ray.get(self._done, timeout=0)
        except ActorUnavailableError as exc:
            # Its process, or its whole node, stopped answering (a lost node reads so for the seconds before Ray's
            # health checks declare it dead).
            return f"Ray actor unreachable{self.node_detail()}, its process or its node lost ({_rpc_error(exc)})"
        except RayActorError as exc:
            return f"Ray actor died{self.node_detail()}: {_death_reason(exc)}"
        except Exception as exc:  # noqa: BLE001 - whatever ended it is only reported
            return f"Ray actor failed: {type(exc).__name__}: {_death_reason(exc)}"
        return "its loop returned"

    @property
    def waiting_for(self) -> str:
        if self._node is None or not ray.is_initialized() or ray.wait([self._node], timeout=0, fetch_local=False)[0]:
            return ""
        # Not placed (no node has its resources and labels free), or placed and its worker still starting.
        return "a Ray node that fits its placement, or its Ray worker to start"

    def node_detail(self) -> str:
        """`` on node IP`` (`` (lost)`` once Ray counts the node dead); empty if it was never placed."""
        try:
            node_id, ip = ray.get(self._node, timeout=0) if self._node is not None else ("", "")
        except Exception:  # noqa: BLE001 - it died before answering: its node is unknown
            return ""
        lost = any(n["NodeID"] == node_id and not n["Alive"] for n in ray.nodes())
        return f" on node {ip}{' (lost)' if lost else ''}" if ip else ""


def _death_reason(exc: BaseException) -> str:
    """Ray's message in one line: its last plain line (the cause, e.g. killed, out of memory, node lost) and
    where the actor ran (Ray lists ``pid``/``ip`` as indented fields)."""
    lines = str(exc).splitlines()
    plain = [line.strip() for line in lines if line.strip() and not line.startswith("\t")]
    where = dict(line.strip().split(": ", 1) for line in lines if line.startswith("\t") and ": " in line)
    reason = plain[-1] if plain else type(exc).__name__
    return f"{reason} (pid {where['pid']} on {where['ip']})" if "pid" in where and "ip" in where else reason


def _rpc_error(exc: ActorUnavailableError) -> str:
    """What the RPC to it said (Ray wraps it in two sentences about the actor and the task)."""
    said = str(exc)
    start, end = said.find("RPC error: "), said.find(" rpc_code")
    return said[start:end] if 0 <= start < end else _death_reason(exc)
