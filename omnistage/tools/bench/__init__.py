"""``omnistage bench``: throughput benchmarks, one module per target."""

from omnistage.tools.bench.cli import add_bench_parser

__all__ = ["add_bench_parser"]
