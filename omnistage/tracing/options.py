"""The tracing flags and :class:`TracingOptions`, read once; light on purpose (no OpenTelemetry import), since the
CLI checks them, and whether the ``otel`` extra is installed, before the pipeline loads.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass

EXTRA = "otel"  # the pyproject extra that installs the SDK and both OTLP exporters
PROTOCOLS = ("grpc", "http/protobuf")
PROTOCOL_ENV = "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"  # OpenTelemetry's own variable, as vLLM reads it
# What each protocol needs imported (the SDK, and that protocol's exporter).
NEEDS = {"grpc": ("opentelemetry.sdk.trace", "opentelemetry.exporter.otlp.proto.grpc.trace_exporter"),
         "http/protobuf": ("opentelemetry.sdk.trace", "opentelemetry.exporter.otlp.proto.http.trace_exporter")}


@dataclass(frozen=True)
class TracingOptions:
    """endpoint: the OTLP collector spans are exported to (None: no tracing, nothing recorded); protocol: how
    (``grpc``, vLLM's default, e.g. ``http://localhost:4317``; ``http/protobuf``, e.g.
    ``http://localhost:4318/v1/traces``)."""

    endpoint: str | None = None
    protocol: str = "grpc"

    def __post_init__(self) -> None:
        if self.protocol not in PROTOCOLS:
            raise ValueError(f"--otlp-traces-protocol takes one of {', '.join(PROTOCOLS)}, got {self.protocol!r}")
        if self.endpoint is not None and "://" not in self.endpoint:
            raise ValueError(f"--otlp-traces-endpoint wants a URL such as http://localhost:4317, got "
                             f"{self.endpoint!r}")

    @property
    def enabled(self) -> bool:
        return self.endpoint is not None

    def missing(self, find_spec: Callable[[str], object] = importlib.util.find_spec) -> str | None:
        """What to tell a user whose environment lacks what tracing needs; None when it has it (or is off)."""
        if not self.enabled:
            return None
        for module in NEEDS[self.protocol]:
            try:
                found = find_spec(module) is not None
            except ModuleNotFoundError:  # its parent package is missing
                found = False
            if not found:
                return (f"--otlp-traces-endpoint needs the OpenTelemetry SDK and OTLP exporter ({module} is not "
                        f"installed): pip install 'omnistage[{EXTRA}]'")
        return None


def add_tracing_args(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("tracing")
    group.add_argument("--otlp-traces-endpoint", default=None, metavar="URL",
                       help="export an OpenTelemetry trace of every request to this OTLP collector: the HTTP "
                            "request, the orchestrator, and each stage with its queue wait, prefill, decode "
                            f"steps and audio chunks (needs pip install 'omnistage[{EXTRA}]'; default: off, "
                            "nothing recorded)")
    group.add_argument("--otlp-traces-protocol", choices=PROTOCOLS, default=None,
                       help=f"OTLP over grpc (default, as vLLM) or http/protobuf; default: ${PROTOCOL_ENV} if set")


def tracing_options_from_args(args: argparse.Namespace, environ: Mapping[str, str] = os.environ) -> TracingOptions:
    protocol = args.otlp_traces_protocol or environ.get(PROTOCOL_ENV) or "grpc"
    return TracingOptions(args.otlp_traces_endpoint, protocol)
