"""Assembling a running pipeline from its stage config: sockets, replicas, orchestrator; and tearing it down.

The default runs each replica in its own process; ``in_process=True`` runs
them as threads of this process (same loop, same messages, ``inproc://``
sockets and tensors passed by reference) for tests and debugging;
``backend="ray"`` runs each as a Ray actor placed by its stage's
``placement``, reaching this process over TCP. Whatever happens, ``close``
(also run at interpreter exit) stops every replica.
"""

from __future__ import annotations

import atexit
import logging
import os
import uuid
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING

import zmq

from omnistage.audio_spec import AudioSpec
from omnistage.config.pipeline import StageSpec
from omnistage.ipc.messages import PayloadTypes, Shutdown
from omnistage.ipc.payloads import GENERIC_PAYLOADS
from omnistage.ipc.queues import AddressBook, Receiver, Sender
from omnistage.pipeline.connectors import TensorConnector, make_connector
from omnistage.pipeline.detokenizer import Tokenizer
from omnistage.pipeline.flow import FlowSettings
from omnistage.pipeline.graph import StageGraph
from omnistage.pipeline.launcher import ProcessReplica, ReplicaHandle, ReplicaLaunch, ThreadReplica
from omnistage.pipeline.options import BACKENDS, PipelineOptions  # noqa: F401 - re-exported
from omnistage.pipeline.orchestrator import Orchestrator, ReplicaLink
from omnistage.pipeline.replica import ReplicaAddresses
from omnistage.pipeline.request_state import TraceSink
from omnistage.workers.base import WorkerFactory, WorkerSpec, build_worker

if TYPE_CHECKING:
    from omnistage.pipeline.ray_cluster import RayCluster

logger = logging.getLogger(__name__)
SHUTDOWN_GRACE_S = 5.0


class PipelineRuntime:
    """Owns the zmq context, every replica and the orchestrator of one pipeline (a stage graph resolved
    through its family; ``factories`` build each stage's worker inside its replica). With a ``trace_sink`` (the
    server traces) every replica times its requests and each finished request's trace goes to the sink."""

    def __init__(self, graph: StageGraph, factories: dict[str, WorkerFactory], tokenizer: Tokenizer | None,
                 audio: AudioSpec | None, options: PipelineOptions | None = None,
                 trace_sink: TraceSink | None = None) -> None:
        self.graph = graph
        self.timed = trace_sink is not None
        self.spec = graph.spec
        self.options = options = options or PipelineOptions()
        self.payloads: PayloadTypes = GENERIC_PAYLOADS + graph.family.payloads
        self.pipeline_id = uuid.uuid4().hex[:12]
        self._closed = False
        self.cluster: RayCluster | None = None
        if options.backend == "ray":
            from omnistage.pipeline.ray_cluster import RayCluster

            self.cluster = RayCluster.connect(options.ray_address)
        self.ctx = zmq.Context()
        self.addresses = AddressBook(options.in_process, self.cluster.node_ip if self.cluster else None)
        self.store: TensorConnector | None = make_connector(options.connector_kind, self.pipeline_id)
        atexit.register(self.close)
        try:
            links = self._make_links(factories)
            settings = FlowSettings(graph, audio, options.talker_min_new_tokens or 0)
            self.orchestrator = Orchestrator(settings, links, tokenizer, self.ctx, options.stall_bounds, trace_sink)
            for link in links:
                link.handle.start()
            self.orchestrator.wait_ready(options.ready_timeout_s)
        except BaseException:
            self.close()
            raise
        self.orchestrator.start()

    def _threads(self, stage: StageSpec) -> int:
        if self.options.threads_per_replica is not None:
            return self.options.threads_per_replica
        if self.cluster is not None:
            from omnistage.pipeline.ray_replica import replica_threads

            return replica_threads(stage.placement)
        return local_threads(stage, sum(s.replicas for s in self.spec.stages), os.cpu_count() or 1)

    def _make_links(self, factories: dict[str, WorkerFactory]) -> list[ReplicaLink]:
        links = []
        for position, stage in enumerate(self.spec.stages):
            new_handle = self._handle_maker(stage, f"stages[{position}].placement")
            for index in range(stage.replicas):
                # Bound before the replica starts, so its connects always find them.
                sender = Sender(self.ctx, self.addresses.new(f"{stage.name}-{index}-in"),
                                self.payloads.replica_input(), self.store, bind=True)
                receiver = Receiver(self.ctx, self.addresses.new(f"{stage.name}-{index}-out"),
                                    self.payloads.replica_message(), self.store, bind=True)
                peer = self.addresses.new(f"{stage.name}-{index}-peer")  # bound by the replica itself
                launch = ReplicaLaunch(stage.name, index, factories[stage.name],
                                       ReplicaAddresses(sender.address, receiver.address, peer),
                                       self.options.connector_kind, self.pipeline_id, self._threads(stage),
                                       stage.nice, self.payloads, self.timed,
                                       self.options.stream_interval_ms / 1000,
                                       logging.getLogger("omnistage").getEffectiveLevel())
                links.append(ReplicaLink(stage.name, index, new_handle(launch), sender, receiver, store=self.store,
                                         payloads=self.payloads))
        return links

    def _handle_maker(self, stage: StageSpec, path: str) -> Callable[[ReplicaLaunch], ReplicaHandle]:
        """How this stage's replicas run: threads, local processes, or Ray actors placed as the stage says
        (its placement checked here, before any replica starts)."""
        if self.options.in_process:
            return partial(ThreadReplica, ctx=self.ctx)
        if self.cluster is not None:
            from omnistage.pipeline.ray_replica import RayReplica, actor_options

            options = actor_options(stage, path)
            return partial(RayReplica, options=options, orchestrator_node=self.cluster.node_id)
        return ProcessReplica

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
        if self.cluster is not None:
            self.cluster.close()


def model_factories(model_dir: str, graph: StageGraph, options: PipelineOptions) -> dict[str, WorkerFactory]:
    """The real stage workers of a checkpoint, one factory per stage: each stage's ``model:`` resolved
    through the family to the worker class its replica imports and builds."""
    return {stage.name: partial(build_worker, WorkerSpec(str(model_dir), stage, graph.models[stage.name].worker,
                                                         options.seamless_audio))
            for stage in graph.spec.stages}


def local_threads(stage: StageSpec, replicas: int, cores: int) -> int:
    """Torch threads of one of ``stage``'s replicas on a machine of ``cores`` running ``replicas`` in all: the
    stage's ``threads`` (-1: every core), else an even share of the cores (at least one)."""
    if stage.threads:
        return cores if stage.threads == -1 else stage.threads
    return max(cores // replicas, 1)
