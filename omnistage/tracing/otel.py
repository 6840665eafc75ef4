"""The server's OpenTelemetry tracer: its own ``TracerProvider`` with a batching OTLP exporter.

Imported only when ``--otlp-traces-endpoint`` is set (it needs the ``otel`` extra). The provider is this
server's alone, never installed as OpenTelemetry's process-wide one (``set_tracer_provider``), so a library
in this process that traces on its own is neither turned on nor redirected by it. Spans are queued on end and
exported by the SDK's thread in batches: making one costs its caller microseconds, never a network wait.
"""

from __future__ import annotations

from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from omnistage.tracing.options import TracingOptions

SCOPE = "omnistage"  # the instrumentation scope every span of the server names

_PROPAGATOR = TraceContextTextMapPropagator()  # W3C trace context: stateless


def span_exporter(options: TracingOptions) -> SpanExporter:
    if options.protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
    else:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter  # type: ignore[assignment]
    return OTLPSpanExporter(endpoint=options.endpoint)


class Tracing:
    """``tracer`` makes the spans; ``close`` exports what is queued and stops the exporter's thread.

    service_name: the ``service.name`` of every span's resource (``OTEL_SERVICE_NAME`` and
    ``OTEL_RESOURCE_ATTRIBUTES`` still apply, as the SDK reads them)."""

    def __init__(self, options: TracingOptions, service_name: str = "omnistage",
                 exporter: SpanExporter | None = None) -> None:
        self.provider = TracerProvider(resource=Resource.create({"service.name": service_name}),
                                       shutdown_on_exit=False)  # closed by the server, not at interpreter exit
        self.provider.add_span_processor(BatchSpanProcessor(exporter or span_exporter(options)))
        self.tracer = self.provider.get_tracer(SCOPE)

    def close(self) -> None:
        self.provider.shutdown()


def context_of(traceparent: str | None) -> Context | None:
    """The context a W3C ``traceparent`` names (None, or one that does not parse: a new trace's root)."""
    return _PROPAGATOR.extract({"traceparent": traceparent}) if traceparent else None
