"""The model families a server knows, recognised from a checkpoint's ``config.json``, imported lazily.

The built-in families are data: a name and where its :class:`Family` lives.
A family's module (and through it its model code) is imported only when a
checkpoint of that family is served or tested. A test adds a family with
:meth:`FamilyRegistry.with_family` (a new registry; nothing process-wide).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING

from omnistage.importing import resolve

if TYPE_CHECKING:  # the registry stays importable without torch (the CLI lists names before anything loads)
    from omnistage.families.base import Family


@dataclass(frozen=True)
class FamilyEntry:
    """A built-in family before its module is imported: where its :class:`Family` lives, the config.json
    ``model_type``\ s it serves (so resolving a checkpoint imports only its own family), and the names of its
    embedded random checkpoints (so ``--help`` and errors list them without importing model code). A test checks
    both against the family's own ``model_types`` and ``hooks.tiny_names``."""

    target: str
    model_types: tuple[str, ...]
    embedded: tuple[str, ...] = ()
    sizes: tuple[str, ...] = ("tiny",)  # what ``make-tiny --size`` writes for this family


BUILTIN: Mapping[str, FamilyEntry] = MappingProxyType({
    "qwen3_omni": FamilyEntry("omnistage.families.qwen3_omni.family:FAMILY", ("qwen3_omni_moe",),
                              ("tiny", "medium", "slice"), sizes=("tiny", "medium", "slice")),
    "qwen3_tts": FamilyEntry("omnistage.families.qwen3_tts.family:FAMILY", ("qwen3_tts",),
                             ("tts-tiny", "tts-tiny-design", "tts-tiny-base", "tts-medium", "tts-medium-design",
                              "tts-medium-base"), sizes=("tiny", "medium", "full", "full-1.7b")),
    "qwen2_5_omni": FamilyEntry("omnistage.families.qwen2_5_omni.family:FAMILY", ("qwen2_5_omni",),
                                ("omni25-tiny",), sizes=("tiny",)),
    "qwen3_asr": FamilyEntry("omnistage.families.qwen3_asr.family:FAMILY", ("qwen3_asr",), ("asr-tiny",),
                             sizes=("tiny", "full", "full-1.7b")),
    "qwen3_forced_aligner": FamilyEntry("omnistage.families.qwen3_asr.family:ALIGNER_FAMILY",
                                        ("qwen3_asr", "qwen3_forced_aligner"), ("aligner-tiny",)),
    "pocket_tts": FamilyEntry("omnistage.families.pocket_tts.family:FAMILY", ("pocket_tts",),
                              ("pocket-tiny", "pocket-tiny-drifting"), sizes=("tiny", "full")),
    "higgs_audio_v2": FamilyEntry("omnistage.families.higgs_audio_v2.family:FAMILY", ("higgs_audio_v2",),
                                  ("higgs-tiny",), sizes=("tiny", "full")),
    "csm": FamilyEntry("omnistage.families.csm.family:FAMILY", ("csm",), ("csm-tiny",), sizes=("tiny", "full")),
    "moshi": FamilyEntry("omnistage.families.moshi.family:FAMILY", ("moshi",),
                         ("moshi-tiny", "moshi-medium", "personaplex-tiny"), sizes=("tiny", "medium")),
})


class UnknownFamily(ValueError):
    pass


class FamilyRegistry:
    def __init__(self, families: Mapping[str, FamilyEntry | Family] = BUILTIN) -> None:
        self._entries = dict(families)  # never rewritten: the data stays readable after a family is imported
        self._loaded: dict[str, Family] = {}

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self._entries)

    @staticmethod
    def _model_types(entry: FamilyEntry | Family) -> tuple[str, ...]:
        return entry.model_types

    def sizes(self) -> dict[str, tuple[str, ...]]:
        """Each built-in family's ``make-tiny --size`` choices (a family added as an object: tiny)."""
        return {n: e.sizes if isinstance(e, FamilyEntry) else ("tiny",) for n, e in self._entries.items()}

    def embedded_names(self) -> tuple[str, ...]:
        """Every ``--model`` name of an embedded random checkpoint, without importing any family."""
        return tuple(n for entry in self._entries.values()
                     for n in (entry.embedded if isinstance(entry, FamilyEntry) else entry.hooks.tiny_names))

    def with_family(self, family: Family) -> FamilyRegistry:
        """A registry that also knows ``family`` (a test's toy family, a plug-in)."""
        return FamilyRegistry({**self._entries, family.name: family})

    def family(self, name: str) -> Family:
        entry = self._entries.get(name)
        if entry is None:
            raise UnknownFamily(f"unknown model family {name!r} (known: {', '.join(self._entries)})")
        if not isinstance(entry, FamilyEntry):
            return entry
        if name not in self._loaded:
            self._loaded[name] = resolve(entry.target)
        return self._loaded[name]

    def for_config(self, raw: Mapping[str, object], where: str = "config.json") -> Family:
        """The family serving a parsed config.json: the one declaring its ``model_type`` (only that family is
        imported); a config without a declared type is asked of each family in turn (each then imported)."""
        model_type = raw.get("model_type")
        declared = [n for n, e in self._entries.items() if model_type in self._model_types(e)]
        for name in declared or self._entries:
            family = self.family(name)
            if family.recognises(raw):
                return family
        raise UnknownFamily(f"{where}: model_type {raw.get('model_type')!r} is no known family's "
                            f"(known: {', '.join(self._entries)})")

    def for_folder(self, folder: str | Path) -> Family:
        path = Path(folder) / "config.json"
        if not path.is_file():
            raise FileNotFoundError(missing_checkpoint(Path(folder), self.embedded_names()))
        return self.for_config(json.loads(path.read_text()), str(path))

    def resolve_model(self, model: str | Path) -> Path:
        """A ``--model`` value as a checkpoint folder: a name of a family's embedded random checkpoints
        (``tiny``, ``tts-tiny``...) through that family's ``cached`` hook (made on first use), else a folder."""
        for family_name, entry in self._entries.items():
            names = entry.embedded if isinstance(entry, FamilyEntry) else entry.hooks.tiny_names
            if str(model) in names:
                from omnistage.families.base import call_hook

                return Path(call_hook(self.family(family_name).hooks.cached, str(model)))
        path = Path(model).expanduser()
        if not (path / "config.json").is_file():
            raise FileNotFoundError(missing_checkpoint(path, self.embedded_names()))
        return path


def missing_checkpoint(path: Path, embedded: tuple[str, ...] = ()) -> str:
    """Why ``path`` is no checkpoint, in words that say what to do (``embedded``: the names that would do
    instead, where the command takes them)."""
    names = f" or an embedded model name ({', '.join(embedded)})" if embedded else ""
    if not path.exists():
        return f"model {str(path)!r} does not exist: give a checkpoint folder{names}"
    if not path.is_dir():
        return f"model {str(path)!r} is a file: give the checkpoint's folder (config.json and *.safetensors)"
    return (f"model folder {path} has no config.json: give a Hugging Face checkpoint folder (config.json and "
            f"*.safetensors){names}")


DEFAULT_REGISTRY = FamilyRegistry()


def resolve_model(model: str | Path) -> Path:
    """A ``--model`` value as a checkpoint folder through the built-in families
    (:meth:`FamilyRegistry.resolve_model`): an embedded random checkpoint's name (``tiny``, ``medium``,
    ``tts-tiny``...), made on first use, else a folder."""
    return DEFAULT_REGISTRY.resolve_model(model)
