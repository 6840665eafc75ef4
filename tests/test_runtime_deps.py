"""Every third-party module the package imports is a declared runtime dependency, or optional by design.

``make serve`` on a fresh machine once failed on ``httpx``, which only the test extra had pulled in: a
dependency met transitively (or by the test extra) hides until someone installs ``pip install .`` alone. So
each top-level import of every ``omnistage`` module (read with ``ast``, nothing imported) is mapped to its
distribution and must be named in pyproject's ``[project].dependencies`` itself. The few imports that are
optional on purpose are listed below with what provides them, and a subprocess proves the server's modules
import with all of them missing.
"""

from __future__ import annotations

import ast
import importlib.metadata
import re
import subprocess
import sys
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "omnistage"


@dataclass(frozen=True)
class OptionalImport:
    why: str
    extra: str | None = None  # the pyproject extra that installs it, when there is one


OPTIONAL: dict[str, OptionalImport] = {
    "ray": OptionalImport("`serve --backend ray`: pipeline/ray_cluster.py imports it on use and names the extra",
                          extra="ray"),
    "matplotlib": OptionalImport("`bench serve --plot`: imported in plot(), which says `pip install matplotlib`",
                                 extra="bench"),
    "triton": OptionalImport("GPU kernels (CUDA builds of torch bring it): each kernel module imports it in "
                             "try/except ImportError and the CPU path uses torch"),
    "onnxruntime": OptionalImport("realtime semantic_vad: audio/smart_turn.py imports it when the classifier loads "
                                  "and says which extra to install", extra="turn"),
    "pyinstrument": OptionalImport("`bench hotpath --profile` only: imported inside measure() when asked"),
    "pocket_tts": OptionalImport("`bench serve --baseline pocket-tts` only: Kyutai's own runtime, run in a "
                                 "subprocess from the folder tools/bench/pocket_env.py installs it into"),
    "qwen_tts": OptionalImport("the Qwen3-TTS reference of `omnistage verify`, run in its own environment "
                               "(tools/verify/tts_reference_env.py installs it)"),
    "torchaudio": OptionalImport("tools/verify/tts_shims/torchaudio is itself an import-only stand-in, on the "
                                 "path of the verify reference subprocess only"),
}
# What a server process imports at start-up (and the kernel modules that guard triton): these must import
# with every OPTIONAL module missing.
SERVER_MODULES = ("omnistage.entrypoints.openai.api_server", "omnistage.entrypoints.cli",
                  "omnistage.pipeline.async_omni", "omnistage.pipeline.runtime",
                  "omnistage.entrypoints.openai.serve_command", "omnistage.layers.fused_moe_triton",
                  "omnistage.layers.attention.triton_paged", "omnistage.layers.quant.int8_triton")


def normalise(name: str) -> str:
    """PEP 503: ``PyYAML``, ``pyyaml`` and ``py_yaml`` name one distribution."""
    return re.sub(r"[-_.]+", "-", name).lower()


def requirement_name(spec: str) -> str:
    match = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", spec)
    assert match, f"cannot read a distribution name from {spec!r}"
    return normalise(match.group(1))


def pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def declared() -> set[str]:
    return {requirement_name(spec) for spec in pyproject()["dependencies"]}


def top_level_imports(source: str, filename: str) -> set[str]:
    """Absolute imports anywhere in the module (functions included: they run when called)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(source, filename)):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names - set(sys.stdlib_module_names) - {"__future__", "omnistage"}


def package_sources() -> dict[str, str]:
    return {str(path.relative_to(ROOT)): path.read_text() for path in sorted(PACKAGE.rglob("*.py"))}


def third_party_imports(sources: Mapping[str, str]) -> dict[str, set[str]]:
    """Top-level module → the files that import it."""
    found: dict[str, set[str]] = {}
    for filename, source in sources.items():
        for name in top_level_imports(source, filename):
            found.setdefault(name, set()).add(filename)
    return found


def undeclared(imports: Mapping[str, Iterable[str]], declared_names: set[str], optional: Iterable[str],
               distributions: Mapping[str, list[str]]) -> list[str]:
    """One line per imported module that no declared distribution provides (optional ones aside)."""
    problems = []
    for module, files in sorted(imports.items()):
        if module in optional:
            continue
        where = ", ".join(sorted(files)[:3])
        dists = distributions.get(module)
        if not dists:
            problems.append(f"{module} (imported by {where}) is not installed and not declared")
        elif not {normalise(d) for d in dists} & declared_names:
            problems.append(f"{module} (imported by {where}) comes from {'/'.join(sorted(set(dists)))}, "
                            "which [project].dependencies does not name")
    return problems


def test_every_import_of_the_package_is_declared() -> None:
    problems = undeclared(third_party_imports(package_sources()), declared(), OPTIONAL,
                          importlib.metadata.packages_distributions())
    assert not problems, "add to pyproject's [project].dependencies, or to OPTIONAL with a reason:\n" + \
        "\n".join(problems)


def test_optional_imports_are_still_imported_and_their_extras_provide_them() -> None:
    imports = third_party_imports(package_sources())
    extras = {name: {requirement_name(s) for s in specs}
              for name, specs in pyproject().get("optional-dependencies", {}).items()}
    distributions = importlib.metadata.packages_distributions()
    for module, entry in OPTIONAL.items():
        assert module in imports, f"{module} is no longer imported: drop it from OPTIONAL"
        provided_by = {normalise(d) for d in distributions.get(module, [module])}
        assert not provided_by & declared(), f"{module} is a declared dependency: drop it from OPTIONAL"
        if entry.extra is not None:
            assert provided_by & extras.get(entry.extra, set()), f"extra {entry.extra!r} does not install {module}"


def test_the_checker_reports_what_it_should() -> None:
    """Self-check: an undeclared import, one met only transitively and one not installed are each reported."""
    fake = {"omnistage/fake.py": "import os\nimport numpy as np\nfrom . import sibling\n"
                                 "from omnistage.core import X\n"
                                 "def later():\n    import starlette.responses\n    import no_such_module_xyz\n"}
    imports = third_party_imports(fake)
    assert set(imports) == {"numpy", "starlette", "no_such_module_xyz"}
    distributions = {"numpy": ["numpy"], "starlette": ["starlette"]}
    problems = undeclared(imports, {"numpy", "fastapi"}, (), distributions)  # starlette: only via fastapi
    assert len(problems) == 2
    assert "starlette" in problems[1] and "no_such_module_xyz" in problems[0] and "not installed" in problems[0]
    assert undeclared(imports, {"numpy", "starlette"}, {"no_such_module_xyz"}, distributions) == []
    assert requirement_name("PyYAML==6.0.4") == "pyyaml" and requirement_name("prometheus_client>=1") == \
        "prometheus-client"


_BLOCKER = """
import importlib.abc, sys
BLOCKED = set(sys.argv[1].split(","))
class Blocker(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {name!r} (blocked by the test)", name=name)
        return None
sys.meta_path.insert(0, Blocker())
import importlib
for module in sys.argv[2].split(","):
    importlib.import_module(module)
loaded = sorted(m for m in sys.modules if m.split(".")[0] in BLOCKED)
assert not loaded, loaded
print("imported", len(sys.argv[2].split(",")), "modules")
"""


def _import_without(blocked: Iterable[str], modules: Iterable[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", _BLOCKER, ",".join(blocked), ",".join(modules)], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)


def test_the_server_imports_with_every_optional_module_missing() -> None:
    result = _import_without(OPTIONAL, SERVER_MODULES)
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"imported {len(SERVER_MODULES)} modules" in result.stdout


def test_the_blocker_blocks() -> None:
    """Self-check: with a module the server needs blocked, the same import fails."""
    result = _import_without(["fastapi"], ["omnistage.entrypoints.openai.api_server"])
    assert result.returncode != 0 and "blocked by the test" in result.stderr
