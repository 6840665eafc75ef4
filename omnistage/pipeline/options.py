"""How to run a pipeline (processes or threads, connector, backend, liveness): light enough for the CLI to
check before torch loads; what to run is the stage config."""

from __future__ import annotations

from dataclasses import dataclass, replace

from omnistage.pipeline.liveness import DEFAULT_STALL_TIMEOUT_S, DEFAULT_STEP_TIMEOUT_S, StallBounds

BACKENDS = ("local", "ray")
CONNECTORS = ("inproc", "shm", "frames")  # how tensors cross stages (pipeline/connectors/)
EMBEDDED_MIN_FRAMES = 8  # 0.64 s of speech: an embedded random checkpoint's shortest reply
# A request's new tokens leave a replica at most this often (merged): a fast step's tokens, one message each,
# cost the server more than the model (pipeline/token_coalescer.py); a step slower than this sends each at once.
DEFAULT_STREAM_INTERVAL_MS = 20.0


@dataclass(frozen=True)
class PipelineOptions:
    """How to run a pipeline (what to run is the stage config).

    connector: how tensors cross stages; None picks ``inproc`` for threads and ``shm`` for processes.
    talker_min_new_tokens: frames the talker must make before it may stop (random-weight checkpoints
        emit codec EOS at once; tests use this to get audio). None: ``EMBEDDED_MIN_FRAMES`` for an embedded
        random checkpoint asked for by name (``tiny``...), 0 for a checkpoint folder (:meth:`for_model`).
    seamless_audio: code2wav chunks keep their left context's tail, so streamed chunks join without
        the 555-sample hole transformers' chunked decode leaves at each boundary.
    threads_per_replica: torch threads in each replica process; None splits the machine's cores (Ray: the
        stage's ``placement.num_cpus``, at least 1).
    backend: ``local`` (processes or threads of this machine) or ``ray`` (actors on a Ray cluster; the
        connector then applies only where a replica shares this machine, tensors to others go in the frames).
    ray_address: the cluster to join (``ray.init(address=...)``); None joins the one started on this
        machine, else starts a local one. Ignored when this process already called ``ray.init``.
    stage_stall_timeout_s: a ready replica silent this long (no output, no heartbeat from its pulse thread) is
        declared stalled (stopped or gone): its requests fail, it is killed and restarted.
    stage_step_timeout_s: a ready replica whose engine loop finishes no pass this long (one step that never
        ends) is declared stalled the same way; much longer, so a long prefill is not mistaken for a hang.
    stream_interval_ms: a request's new tokens leave its replica at most this often, merged (its first and last
        at once); a talker's plain frame notices (merged) and a changed load alone too; 0 sends each step's.
    """

    in_process: bool = False
    connector: str | None = None
    talker_min_new_tokens: int | None = None
    seamless_audio: bool = True
    ready_timeout_s: float = 900.0
    threads_per_replica: int | None = None
    backend: str = "local"
    ray_address: str | None = None
    stage_stall_timeout_s: float = DEFAULT_STALL_TIMEOUT_S
    stage_step_timeout_s: float = DEFAULT_STEP_TIMEOUT_S
    stream_interval_ms: float = DEFAULT_STREAM_INTERVAL_MS

    def __post_init__(self) -> None:
        if self.talker_min_new_tokens is not None and self.talker_min_new_tokens < 0:
            raise ValueError(f"--talker-min-new-tokens must be >= 0, got {self.talker_min_new_tokens}")
        if not 0 <= self.stream_interval_ms <= 1000:
            raise ValueError(f"--stream-interval-ms must be within [0, 1000], got {self.stream_interval_ms:g}")
        StallBounds(self.stage_stall_timeout_s, self.stage_step_timeout_s)  # a bad pair raises here, not at start
        if self.backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, got {self.backend!r}")
        if self.backend == "ray" and (self.in_process or self.connector == "inproc"):
            raise ValueError("backend 'ray' runs replicas in Ray actors: in_process and the inproc connector "
                             "need them in this process")
        if self.ray_address is not None and self.backend != "ray":
            raise ValueError("ray_address needs backend 'ray'")
        if (self.ray_address or "").startswith("ray://"):
            # Replicas connect back to this process's sockets, so it must run on a cluster node itself.
            raise ValueError("ray_address: Ray Client (ray://) is not supported; run the server on a cluster node "
                             "and give the cluster's GCS address (HOST:6379) or 'auto'")

    def for_model(self, embedded: bool) -> PipelineOptions:
        """These options with the talker's floor decided: as given, else a floor for an embedded random
        checkpoint (``embedded``), whose talker samples its end code at the first frame now and then (a user's
        first reply from ``make serve`` or ``Omni("tiny")`` must not be an empty WAV); a real checkpoint stops
        where its talker says."""
        if self.talker_min_new_tokens is not None:
            return self
        return replace(self, talker_min_new_tokens=EMBEDDED_MIN_FRAMES if embedded else 0)

    @property
    def stall_bounds(self) -> StallBounds:
        return StallBounds(self.stage_stall_timeout_s, self.stage_step_timeout_s)

    @property
    def connector_kind(self) -> str:
        return self.connector or ("inproc" if self.in_process else "shm")
