"""A family is one package: the registry resolves a checkpoint by its declared ``model_type`` (importing only that
family), generic layers never import a family, and what a family knows (voices, shardable stages, sizes) comes
from it."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from omnistage.config.pipeline import ConfigError, parse_pipeline
from omnistage.families.registry import BUILTIN, DEFAULT_REGISTRY, UnknownFamily
from omnistage.pipeline.graph import resolve_graph

REPO = Path(__file__).resolve().parents[2]
GENERIC = ("entrypoints", "pipeline", "engine", "runner", "workers", "config", "processing", "layers", "ipc", "audio",
           "tiny")
FAMILY_MODULES = ("omnistage.families.qwen3_omni", "omnistage.models.qwen3_omni", "omnistage.families.qwen3_tts",
                  "omnistage.models.qwen3_tts", "omnistage.families.qwen2_5_omni", "omnistage.models.qwen2_5_omni",
                  "omnistage.families.qwen3_asr", "omnistage.families.moshi")

PACKAGES = {"qwen3_forced_aligner": "qwen3_asr"}  # a family that lives in another family's package


def _imported_after_resolving(model_type: str, tmp_path: Path) -> set[str]:
    (tmp_path / "config.json").write_text(json.dumps({"model_type": model_type}))
    script = ("import sys; from omnistage.families.registry import DEFAULT_REGISTRY; "
              f"print(DEFAULT_REGISTRY.for_folder({str(tmp_path)!r}).name); "
              f"print(' '.join(m for m in sys.modules if m.startswith({FAMILY_MODULES!r})))")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True, cwd=REPO,
                         timeout=120).stdout.splitlines()
    return {out[0], *out[1].split()}


@pytest.mark.parametrize(("model_type", "family", "foreign"), [
    ("qwen3_tts", "qwen3_tts", ("qwen3_omni", "qwen2_5_omni")),
    ("qwen3_omni_moe", "qwen3_omni", ("qwen3_tts", "qwen2_5_omni")),
    ("qwen2_5_omni", "qwen2_5_omni", ("qwen3_omni", "qwen3_tts")),
    ("qwen3_asr", "qwen3_asr", ("qwen3_omni", "qwen3_tts", "qwen2_5_omni")),
    ("qwen3_forced_aligner", "qwen3_forced_aligner", ("qwen3_omni", "qwen3_tts", "qwen2_5_omni")),
    ("moshi", "moshi", ("qwen3_omni", "qwen3_tts", "qwen2_5_omni", "pocket_tts")),
])
def test_resolving_a_checkpoint_imports_only_its_own_family(model_type: str, family: str, foreign: tuple[str, ...],
                                                            tmp_path: Path) -> None:
    imported = _imported_after_resolving(model_type, tmp_path)
    package = PACKAGES.get(family, family)
    assert family in imported and any(m.startswith(f"omnistage.families.{package}") for m in imported)
    assert not [m for m in imported if any(f in m for f in foreign)]


def test_the_registry_data_is_each_familys_own() -> None:
    for name, entry in BUILTIN.items():
        family = DEFAULT_REGISTRY.family(name)
        assert entry.model_types == family.model_types
        assert entry.embedded == family.hooks.tiny_names
    # the data stays readable once the families are imported (make-tiny's --size choices come from it)
    assert DEFAULT_REGISTRY.sizes()["qwen3_omni"] == ("tiny", "medium", "slice")
    with pytest.raises(UnknownFamily, match="'llama' is no known family's"):
        DEFAULT_REGISTRY.for_config({"model_type": "llama"})


def test_no_generic_layer_imports_a_family() -> None:
    offenders = []
    for folder in GENERIC:
        for path in (REPO / "omnistage" / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                    [node.module or ""] if isinstance(node, ast.ImportFrom) else []
                offenders += [f"{path.relative_to(REPO)}: {n}" for n in names if n.startswith(FAMILY_MODULES)]
    assert offenders == []


def test_only_the_familys_shardable_stages_take_tensor_parallelism() -> None:
    family = DEFAULT_REGISTRY.family("qwen3_omni")
    assert family.tensor_parallel_models == ("thinker",)
    data = yaml.safe_load((REPO / "omnistage/families/qwen3_omni/qwen3_omni.yaml").read_text())
    data["stages"][1]["tensor_parallel_size"] = 2  # the talker
    spec = parse_pipeline(data)  # the YAML alone cannot know which stages a family can shard
    with pytest.raises(ConfigError, match=r"stages\[1\]\.tensor_parallel_size: .*qwen3_omni's thinker stages only"):
        resolve_graph(spec, family)
    assert DEFAULT_REGISTRY.family("qwen3_tts").tensor_parallel_models == ()


def test_openai_voice_names_map_through_the_served_familys_table() -> None:
    from omnistage.entrypoints.openai.common.voice_names import VoiceBook
    from omnistage.families.qwen3_omni.voices import OPENAI_VOICES as OMNI
    from omnistage.families.qwen3_tts.openai_voices import OPENAI_VOICES as TTS

    omni = VoiceBook(("Chelsie", "Ethan", "Aiden"), OMNI, default="Ethan")
    assert (omni.resolve("alloy"), omni.resolve("cedar"), omni.resolve(None)) == ("Chelsie", "Ethan", "Ethan")
    tts = VoiceBook(("ryan", "aiden", "vivian", "dylan"), TTS)
    assert (tts.resolve("alloy"), tts.resolve("onyx"), tts.resolve(None)) == ("vivian", "ryan", "ryan")
    assert VoiceBook(("uncle_fu",), TTS).resolve("alloy") == "uncle_fu"  # the speaker is missing: the first
