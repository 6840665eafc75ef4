"""The model families a server knows, recognised from a checkpoint's ``config.json``, imported lazily.

The built-in families are data: a name and where its :class:`Family` lives.
A family's module (and through it its model code) is imported only when a
checkpoint of that family is served or tested. A test adds a family with
:meth:`FamilyRegistry.with_family` (a new registry; nothing process-wide).
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType

from omnistage.families.base import Family, call_hook

BUILTIN: Mapping[str, str] = MappingProxyType({
    "qwen3_omni": "omnistage.families.qwen3_omni.family:FAMILY",
    "qwen3_tts": "omnistage.families.qwen3_tts.family:FAMILY",
})


class UnknownFamily(ValueError):
    pass


class FamilyRegistry:
    def __init__(self, families: Mapping[str, str | Family] = BUILTIN) -> None:
        self._entries = dict(families)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self._entries)

    def with_family(self, family: Family) -> FamilyRegistry:
        """A registry that also knows ``family`` (a test's toy family, a plug-in)."""
        return FamilyRegistry({**self._entries, family.name: family})

    def family(self, name: str) -> Family:
        entry = self._entries.get(name)
        if entry is None:
            raise UnknownFamily(f"unknown model family {name!r} (known: {', '.join(self._entries)})")
        if isinstance(entry, str):
            module, _, attr = entry.partition(":")
            entry = self._entries[name] = getattr(importlib.import_module(module), attr)
        return entry

    def for_config(self, raw: Mapping[str, object], where: str = "config.json") -> Family:
        for name in self._entries:
            family = self.family(name)
            if family.recognises(raw):
                return family
        raise UnknownFamily(f"{where}: model_type {raw.get('model_type')!r} is no known family's "
                            f"(known: {', '.join(self._entries)})")

    def for_folder(self, folder: str | Path) -> Family:
        path = Path(folder) / "config.json"
        if not path.is_file():
            raise FileNotFoundError(f"model folder {folder} has no config.json")
        return self.for_config(json.loads(path.read_text()), str(path))

    def resolve_model(self, model: str | Path) -> Path:
        """A ``--model`` value as a checkpoint folder: a name of a family's embedded random checkpoints
        (``tiny``, ``tts-tiny``...) through that family's ``cached`` hook (made on first use), else a folder."""
        for family_name in self._entries:
            family = self.family(family_name)
            if str(model) in family.hooks.tiny_names:
                return Path(call_hook(family.hooks.cached, str(model)))
        path = Path(model).expanduser()
        if not (path / "config.json").is_file():
            names = [n for f in self._entries for n in self.family(f).hooks.tiny_names]
            raise FileNotFoundError(f"model folder {path} has no config.json (embedded models: {', '.join(names)})")
        return path


DEFAULT_REGISTRY = FamilyRegistry()
