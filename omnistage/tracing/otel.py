"""The server's tracing: its own OpenTelemetry ``TracerProvider`` with a batching OTLP exporter, and the
orchestrator's sink that makes each finished request's pipeline spans with it.

Imported only when ``--otlp-traces-endpoint`` is set (it needs the ``otel`` extra). The provider is this
server's alone, never installed as OpenTelemetry's process-wide one (``set_tracer_provider``), so a library
in this process that traces on its own is neither turned on nor redirected by it. Spans are queued on end and
exported by the SDK's thread in batches: making one costs its caller microseconds, never a network wait.
"""

from __future__ import annotations

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter

from omnistage.tracing.options import TracingOptions
from omnistage.tracing.pipeline_spans import PipelineSpans

SCOPE = "omnistage"  # the instrumentation scope every span of the server names


def span_exporter(options: TracingOptions) -> SpanExporter:
    if options.protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
    else:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter  # type: ignore[assignment]
    return OTLPSpanExporter(endpoint=options.endpoint)


class Tracing:
    """``provider`` makes the spans (FastAPI's for the HTTP requests too), ``pipeline`` is the orchestrator's sink;
    ``close`` makes what the sink still holds, exports everything queued and stops both threads.

    model: the served model's name (``gen_ai.response.model``). service_name: the ``service.name`` of every
    span's resource (``OTEL_SERVICE_NAME`` and ``OTEL_RESOURCE_ATTRIBUTES`` still apply, as the SDK reads them).
    exporter: instead of the options' OTLP exporter (tests)."""

    def __init__(self, options: TracingOptions, model: str, service_name: str = "omnistage",
                 exporter: SpanExporter | None = None) -> None:
        self.provider = TracerProvider(resource=Resource.create({"service.name": service_name}),
                                       shutdown_on_exit=False)  # closed by the server, not at interpreter exit
        self.provider.add_span_processor(BatchSpanProcessor(exporter or span_exporter(options)))
        self.tracer = self.provider.get_tracer(SCOPE)
        self.pipeline = PipelineSpans(self.tracer, model)

    def close(self) -> None:
        self.pipeline.close()
        self.provider.shutdown()
