"""The tracing flags: off by default, read once, a missing extra named before anything loads, and with the flag
unset a server imports no OpenTelemetry SDK or exporter."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from omnistage.entrypoints.cli import build_parser
from omnistage.entrypoints.serve_config import ServeConfig
from omnistage.tracing.options import TracingOptions

ROOT = Path(__file__).resolve().parents[2]
ENDPOINT = "http://127.0.0.1:4318/v1/traces"


def _config(*flags: str, environ: dict[str, str] | None = None) -> ServeConfig:
    return ServeConfig.from_args(build_parser().parse_args(["serve", "tiny", *flags]), environ=environ or {})


def test_tracing_is_off_unless_an_endpoint_is_given() -> None:
    assert not _config().tracing.enabled and _config().tracing.missing() is None
    on = _config("--otlp-traces-endpoint", ENDPOINT).tracing
    assert on.enabled and on.endpoint == ENDPOINT and on.protocol == "grpc"  # vLLM's default


def test_the_protocol_comes_from_the_flag_else_opentelemetrys_variable() -> None:
    environ = {"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf"}
    assert _config("--otlp-traces-endpoint", ENDPOINT, environ=environ).tracing.protocol == "http/protobuf"
    flagged = _config("--otlp-traces-endpoint", ENDPOINT, "--otlp-traces-protocol", "grpc", environ=environ)
    assert flagged.tracing.protocol == "grpc"
    with pytest.raises(ValueError, match="otlp-traces-protocol"):
        _config("--otlp-traces-endpoint", ENDPOINT, environ={"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "json"})
    with pytest.raises(ValueError, match="wants a URL"):
        _config("--otlp-traces-endpoint", "localhost:4317")


def test_a_missing_exporter_is_named_with_the_extra_that_installs_it() -> None:
    options = TracingOptions(ENDPOINT, "http/protobuf")
    assert options.missing() is None  # the test environment has the extra

    def without_exporters(name: str) -> object | None:
        if name.startswith("opentelemetry.exporter"):
            raise ModuleNotFoundError(name)
        return object()

    message = options.missing(find_spec=without_exporters)
    assert message is not None and "pip install 'omnistage[otel]'" in message and "--otlp-traces-endpoint" in message
    grpc = TracingOptions(ENDPOINT, "grpc").missing(find_spec=lambda name: None if ".grpc." in name else object())
    assert grpc is not None and "opentelemetry.exporter.otlp.proto.grpc" in grpc


# The SDK and exporters made unimportable, as without the extra: a server without the flag builds its app and
# serves as before, and with the flag `serve` stops at once with the extra's name.
_WITHOUT_SDK = """
import importlib.abc, sys
class Blocker(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.startswith(("opentelemetry.sdk", "opentelemetry.exporter")):
            raise ModuleNotFoundError(f"No module named {name!r} (blocked by the test)", name=name)
        return None
sys.meta_path.insert(0, Blocker())
from fastapi.testclient import TestClient
from omnistage.entrypoints.cli import build_parser
from omnistage.core import OmniRequest
from omnistage.entrypoints.openai.api_server import build_app
from omnistage.entrypoints.openai.common.http_spans import traced
from omnistage.families.qwen3_omni.prompt import Qwen3OmniPrompt
from omnistage.entrypoints.openai.serve_command import open_tracing, run_server
from omnistage.entrypoints.serve_config import ServeConfig
from omnistage.usage_error import UsageError
from tests.entrypoints.fake_engine import FakeEngine, fake_front_end

def config(*flags):
    return ServeConfig.from_args(build_parser().parse_args(["serve", "tiny", *flags]), environ={})

off = config()
assert open_tracing(off) is None
client = TestClient(build_app(FakeEngine(fake_front_end(None))))
assert client.get("/v1/models").status_code == 200
request = OmniRequest("r", Qwen3OmniPrompt([1]))
assert traced(request) is request  # no span: nothing to carry
try:
    run_server(config("--otlp-traces-endpoint", "http://127.0.0.1:4318/v1/traces"), None)
except UsageError as exc:
    print("usage error:", exc)
print("loaded:", sorted(m for m in sys.modules if m.startswith(("opentelemetry.sdk", "opentelemetry.exporter"))))
"""


def test_without_the_extra_a_server_serves_untraced_and_the_flag_names_the_extra() -> None:
    result = subprocess.run([sys.executable, "-c", _WITHOUT_SDK], cwd=ROOT, capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "usage error: --otlp-traces-endpoint needs the OpenTelemetry SDK" in result.stdout
    assert "pip install 'omnistage[otel]'" in result.stdout
    assert "loaded: []" in result.stdout


def test_each_protocol_gets_its_otlp_exporter() -> None:
    from omnistage.tracing.otel import span_exporter

    grpc = span_exporter(TracingOptions("http://127.0.0.1:4317", "grpc"))
    http = span_exporter(TracingOptions(ENDPOINT, "http/protobuf"))
    try:
        assert type(grpc).__module__ == "opentelemetry.exporter.otlp.proto.grpc.trace_exporter"
        assert type(http).__module__ == "opentelemetry.exporter.otlp.proto.http.trace_exporter"
    finally:
        grpc.shutdown()
        http.shutdown()
