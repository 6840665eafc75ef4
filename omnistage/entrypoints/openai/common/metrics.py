"""Prometheus metrics for /metrics: request outcomes and latencies from the server, load from the engine.

Each app owns its registry (no global state), so several apps can live in one
process, as they do in tests. Engine load (KV blocks, queues) is read from
``engine.stats()`` at scrape time rather than pushed, so it is never stale.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from omnistage.core import OmniOutput
from omnistage.entrypoints.openai.common.served_model import audio_rate
from omnistage.entrypoints.openai.engine_protocol import OmniEngine
from omnistage.pipeline.playback import Playback

_LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
_LAG_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
_RTF_BUCKETS = (0.05, 0.1, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 4.0, 10.0)


class _EngineCollector(Collector):
    def __init__(self, engine: OmniEngine) -> None:
        self.engine = engine

    def collect(self) -> Iterator[Metric]:
        labels = ["stage", "replica"]
        used = GaugeMetricFamily("omnistage_kv_blocks_used", "KV cache blocks in use", labels=labels)
        total = GaugeMetricFamily("omnistage_kv_blocks_total", "KV cache blocks allocated", labels=labels)
        kv_bytes = GaugeMetricFamily("omnistage_kv_cache_bytes", "memory held by the KV cache", labels=labels)
        queued = GaugeMetricFamily("omnistage_queue_depth", "requests waiting to be scheduled", labels=labels)
        running = GaugeMetricFamily("omnistage_requests_running", "requests scheduled in a stage", labels=labels)
        graphs = GaugeMetricFamily("omnistage_cuda_graphs_captured", "CUDA graph sets captured at start-up",
                                   labels=labels)
        failed = GaugeMetricFamily("omnistage_cuda_graph_capture_failures",
                                   "CUDA graph sets whose capture failed (those steps run eagerly)", labels=labels)
        moved = CounterMetricFamily("omnistage_orchestrator_bytes", "message bytes between the server's orchestrator "
                                    "and a replica (tensors in shared memory count as their keys)",
                                    labels=[*labels, "direction"])
        stats = self.engine.stats()
        yield GaugeMetricFamily("omnistage_shm_segments", "shared-memory tensors in flight between stages",
                                value=stats.shm_segments)
        for r in stats.replicas:
            key = [r.stage, str(r.replica)]
            used.add_metric(key, r.kv_blocks_used)
            total.add_metric(key, r.kv_blocks_total)
            kv_bytes.add_metric(key, r.kv_cache_bytes)
            queued.add_metric(key, r.queue_depth)
            running.add_metric(key, r.running)
            graphs.add_metric(key, r.graphs_captured)
            failed.add_metric(key, r.graph_capture_failures)
            moved.add_metric([*key, "to_replica"], r.bytes_sent)
            moved.add_metric([*key, "from_replica"], r.bytes_received)
        yield from (used, total, kv_bytes, queued, running, graphs, failed, moved)


class ServerMetrics:
    def __init__(self, engine: OmniEngine) -> None:
        self.sample_rate = audio_rate(engine)  # the served family's audio: what a request's samples last
        self.registry = CollectorRegistry()
        self.requests = Counter("omnistage_requests", "finished API requests", ["endpoint", "outcome"],
                                registry=self.registry)
        self.in_flight = Gauge("omnistage_requests_in_flight", "API requests being served", ["endpoint"],
                               registry=self.registry)
        self.ttft = Histogram("omnistage_time_to_first_token_seconds", "request start to first text",
                              ["endpoint"], buckets=_LATENCY_BUCKETS, registry=self.registry)
        self.ttfa = Histogram("omnistage_time_to_first_audio_seconds", "request start to first audio chunk",
                              ["endpoint"], buckets=_LATENCY_BUCKETS, registry=self.registry)
        self.rtf = Histogram("omnistage_audio_real_time_factor", "generation seconds per second of audio",
                             ["endpoint"], buckets=_RTF_BUCKETS, registry=self.registry)
        self.underruns = Counter("omnistage_audio_underruns", "times a streamed answer's player ran dry before the "
                                 "next audio arrived", ["endpoint"], registry=self.registry)
        self.stall = Histogram("omnistage_audio_stall_seconds", "how long a streamed answer's player waited, "
                               "per underrun", ["endpoint"], buckets=_LATENCY_BUCKETS, registry=self.registry)
        self.loop_lag = Histogram("omnistage_event_loop_lag_seconds", "how much later than due the API's event loop "
                                  "ran a timer (every request waits that long)", buckets=_LAG_BUCKETS,
                                  registry=self.registry)
        self.speculative = Counter("omnistage_realtime_speculative_replies", "realtime replies started at a pause in "
                                   "the user's turn, by outcome: used (the turn ended there) or dropped (the user "
                                   "spoke on, or the session changed first)", ["outcome"], registry=self.registry)
        self.registry.register(_EngineCollector(engine))

    def render(self) -> bytes:
        return generate_latest(self.registry)

    def count_speculation(self, outcome: str) -> None:
        self.speculative.labels(outcome).inc()

    def track(self, endpoint: str, start: float, streamed: bool = False) -> RequestTimer:
        return RequestTimer(self, endpoint, start, streamed)


class RequestTimer:
    """Times one request from ``start`` (``time.perf_counter()`` when it arrived, so media
    decoding and prompt processing count towards the latencies, as the client sees them).

    A ``streamed`` answer's audio is played as it arrives: a player that starts at the first chunk and pauses
    when it runs dry counts each underrun and its stall, as the caller would hear it."""

    def __init__(self, metrics: ServerMetrics, endpoint: str, start: float, streamed: bool = False) -> None:
        self.metrics = metrics
        self.endpoint = endpoint
        self.start = start
        self.player = Playback() if streamed else None
        self.audio_samples = 0
        self._first_text = self._first_audio = False
        self._done = False
        metrics.in_flight.labels(endpoint).inc()

    def observe(self, out: OmniOutput) -> None:
        now = time.perf_counter() - self.start
        if out.text and not self._first_text:
            self._first_text = True
            self.metrics.ttft.labels(self.endpoint).observe(now)
        if out.audio is not None and out.audio.size:
            if not self._first_audio:
                self._first_audio = True
                self.metrics.ttfa.labels(self.endpoint).observe(now)
            self.audio_samples += int(out.audio.size)
            if self.player is not None:
                stall = self.player.delivered(now, out.audio.size / self.metrics.sample_rate)
                if stall > 0:
                    self.metrics.underruns.labels(self.endpoint).inc()
                    self.metrics.stall.labels(self.endpoint).observe(stall)

    def finish(self, outcome: str) -> None:
        """``outcome``: ok, engine_error, client_disconnected. Later calls are ignored."""
        if self._done:
            return
        self._done = True
        self.metrics.in_flight.labels(self.endpoint).dec()
        self.metrics.requests.labels(self.endpoint, outcome).inc()
        if outcome == "ok" and self.audio_samples:
            elapsed = time.perf_counter() - self.start
            self.metrics.rtf.labels(self.endpoint).observe(elapsed / (self.audio_samples / self.metrics.sample_rate))
