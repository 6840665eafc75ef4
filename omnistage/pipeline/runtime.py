"""Assembling a running pipeline from its stage config: sockets, replicas, orchestrator; and tearing it down.

The default runs each replica in its own process; ``in_process=True`` runs
them as threads of this process (same loop, same messages, ``inproc://``
sockets and tensors passed by reference) for tests and debugging. Whatever
happens, ``close`` (also run at interpreter exit) stops every replica.
"""

from __future__ import annotations

import atexit
import logging
import os
import uuid
from dataclasses import dataclass
from functools import partial

import zmq

from omnistage.config.pipeline import PipelineSpec
from omnistage.ipc.messages import ReplicaInput, ReplicaMessage, Shutdown
from omnistage.ipc.queues import AddressBook, Receiver, Sender
from omnistage.pipeline.connectors import TensorConnector, make_connector
from omnistage.pipeline.detokenizer import Tokenizer
from omnistage.pipeline.flow import FlowSettings
from omnistage.pipeline.launcher import ProcessReplica, ReplicaHandle, ReplicaLaunch, ThreadReplica
from omnistage.pipeline.orchestrator import Orchestrator, ReplicaLink
from omnistage.pipeline.replica import ReplicaAddresses
from omnistage.pipeline.stage import WorkerFactory
from omnistage.pipeline.topology import topology_of

logger = logging.getLogger(__name__)
SHUTDOWN_GRACE_S = 5.0


@dataclass(frozen=True)
class PipelineOptions:
    """How to run a pipeline (what to run is the stage config).

    connector: how tensors cross stages; None picks ``inproc`` for threads and ``shm`` for processes.
    talker_min_new_tokens: frames the talker must make before it may stop (random-weight checkpoints
        emit codec EOS at once; tests use this to get audio).
    seamless_audio: code2wav chunks keep their left context's tail, so streamed chunks join without
        the 555-sample hole transformers' chunked decode leaves at each boundary.
    threads_per_replica: torch threads in each replica process; None splits the machine's cores.
    """

    in_process: bool = False
    connector: str | None = None
    talker_min_new_tokens: int = 0
    seamless_audio: bool = True
    ready_timeout_s: float = 900.0
    threads_per_replica: int | None = None

    @property
    def connector_kind(self) -> str:
        return self.connector or ("inproc" if self.in_process else "shm")


class PipelineRuntime:
    """Owns the zmq context, every replica and the orchestrator of one pipeline."""

    def __init__(self, spec: PipelineSpec, factories: dict[str, WorkerFactory], tokenizer: Tokenizer | None,
                 num_code_groups: int, options: PipelineOptions | None = None) -> None:
        self.spec = spec
        self.options = options = options or PipelineOptions()
        self.topology = topology_of(spec)
        self.pipeline_id = uuid.uuid4().hex[:12]
        self.ctx = zmq.Context()
        self.addresses = AddressBook(options.in_process)
        self.store: TensorConnector | None = make_connector(options.connector_kind, self.pipeline_id)
        self._closed = False
        links = self._make_links(factories)
        settings = FlowSettings(spec, self.topology, num_code_groups, options.talker_min_new_tokens)
        self.orchestrator = Orchestrator(settings, links, tokenizer, self.ctx)
        atexit.register(self.close)
        try:
            for link in links:
                link.handle.start()
            self.orchestrator.wait_ready(options.ready_timeout_s)
        except BaseException:
            self.close()
            raise
        self.orchestrator.start()

    def _threads(self) -> int:
        if self.options.threads_per_replica is not None:
            return self.options.threads_per_replica
        total = sum(stage.replicas for stage in self.spec.stages)
        return max((os.cpu_count() or 1) // total, 1)

    def _make_links(self, factories: dict[str, WorkerFactory]) -> list[ReplicaLink]:
        links = []
        for stage in self.spec.stages:
            for index in range(stage.replicas):
                addresses = ReplicaAddresses(self.addresses.new(f"{stage.name}-{index}-in"),
                                             self.addresses.new(f"{stage.name}-{index}-out"))
                # Bound before the replica starts, so its connects always find them.
                sender = Sender(self.ctx, addresses.inputs, ReplicaInput, self.store, bind=True)
                receiver = Receiver(self.ctx, addresses.outputs, ReplicaMessage, self.store, bind=True)
                launch = ReplicaLaunch(stage.name, index, factories[stage.name], addresses,
                                       self.options.connector_kind, self.pipeline_id, self._threads())
                handle: ReplicaHandle = (ThreadReplica(launch, self.ctx) if self.options.in_process
                                         else ProcessReplica(launch))
                links.append(ReplicaLink(stage.name, index, handle, sender, receiver))
        return links

    def close(self) -> None:
        """Stops the orchestrator, asks every replica to stop, kills those that do not. Idempotent."""
        if self._closed:
            return
        self._closed = True
        atexit.unregister(self.close)
        orch = self.orchestrator if hasattr(self, "orchestrator") else None
        if orch is not None:
            orch.stop()
            links = list(orch.links.values())
            for link in links:
                if link.handle.is_alive():
                    try:
                        link.sender.send(Shutdown(), block=False)
                    except zmq.Again:
                        pass  # not connected yet (a restart still loading): the join below kills it
            for link in links:
                if not link.handle.join(SHUTDOWN_GRACE_S):
                    logger.warning("stage %s replica %d ignored shutdown; killing it", link.stage, link.index)
                    link.handle.kill()
            orch.close_sockets()
        if self.store is not None:
            self.store.cleanup()
        if orch is not None and any(link.handle.is_alive() for link in orch.links.values()):
            # A replica thread still inside a step holds its sockets; destroying them under it could crash it.
            logger.warning("a replica thread is still running; leaving its zmq context open")
        else:
            self.ctx.destroy(linger=0)
        self.addresses.cleanup()


def model_factories(model_dir: str, spec: PipelineSpec, options: PipelineOptions) -> dict[str, WorkerFactory]:
    """The real stage workers of a Qwen3-Omni checkpoint, one factory per stage."""
    from omnistage.pipeline.workers import WorkerSpec, build_worker

    return {stage.name: partial(build_worker, WorkerSpec(str(model_dir), stage, options.seamless_audio))
            for stage in spec.stages}
