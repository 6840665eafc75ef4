"""An OTLP/HTTP trace receiver in the test's process: what a collector would get, decoded from the protobuf
``ExportTraceServiceRequest`` the exporter posts to ``/v1/traces``."""

from __future__ import annotations

import gzip
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue


@dataclass(frozen=True)
class ReceivedSpan:
    name: str
    trace_id: str
    span_id: str
    parent_id: str  # "" for a root
    start_ns: int
    end_ns: int
    kind: int
    attributes: dict[str, object]
    events: tuple[tuple[str, int], ...]  # (name, time) in order


def _value(value: AnyValue) -> object:
    kind = value.WhichOneof("value")
    if kind == "array_value":
        return [_value(v) for v in value.array_value.values]
    return getattr(value, kind) if kind else None


def _span(span) -> ReceivedSpan:  # noqa: ANN001 - a protobuf Span
    return ReceivedSpan(span.name, span.trace_id.hex(), span.span_id.hex(), span.parent_span_id.hex(),
                        span.start_time_unix_nano, span.end_time_unix_nano, span.kind,
                        {a.key: _value(a.value) for a in span.attributes},
                        tuple((e.name, e.time_unix_nano) for e in span.events))


class OtlpReceiver:
    def __init__(self) -> None:
        self.spans: list[ReceivedSpan] = []
        self.posts = 0
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                request = ExportTraceServiceRequest.FromString(body)
                spans = [_span(s) for rs in request.resource_spans for ss in rs.scope_spans for s in ss.spans]
                with receiver._lock:
                    receiver.spans.extend(spans)
                    receiver.posts += 1
                reply = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/v1/traces"

    def __enter__(self) -> OtlpReceiver:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()

    def wait_for(self, names: set[str], timeout_s: float) -> list[ReceivedSpan]:
        """Every span received once spans of all these names have come (or the timeout passed)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with self._lock:
                if names <= {s.name for s in self.spans}:
                    return list(self.spans)
            time.sleep(0.05)
        with self._lock:
            return list(self.spans)
