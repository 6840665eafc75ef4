"""The thinker's sampling when a request leaves a knob unset, as vLLM picks it.

vLLM applies the checkpoint's ``generation_config.json`` to every knob a request
leaves out (``--generation-config auto``); here the stage config's ``sampling:``
(the preset's thinker: greedy) is the base, the checkpoint's file wins over it
for the keys it sets, and the request wins over both. ``--generation-config vllm``
ignores the checkpoint's file (vLLM's spelling), a folder reads that folder's.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path

from omnistage.sampling_params import SamplingParams

GENERATION_CONFIG = "generation_config.json"


@dataclass(frozen=True)
class SamplingDefaults:
    """max_tokens: None = what the context leaves (vLLM's default when the checkpoint sets no max_new_tokens)."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    repetition_penalty: float = 1.0
    max_tokens: int | None = None


def _from_file(path: Path) -> dict[str, float | int]:
    """The sampling keys of one ``generation_config.json`` (``do_sample: false`` means greedy, as in transformers)."""
    if not path.is_file():
        return {}
    raw = json.loads(path.read_text())
    found: dict[str, float | int] = {}
    for key, kind in (("temperature", float), ("top_p", float), ("top_k", int), ("repetition_penalty", float)):
        if isinstance(raw.get(key), (int, float)) and not isinstance(raw.get(key), bool):
            found[key] = kind(raw[key])
    if raw.get("do_sample") is False:
        found["temperature"] = 0.0
    if isinstance(raw.get("max_new_tokens"), int) and raw["max_new_tokens"] > 0:
        found["max_tokens"] = int(raw["max_new_tokens"])
    return found


def sampling_defaults(stage: SamplingParams, folder: Path, generation_config: str = "auto") -> SamplingDefaults:
    """``generation_config``: ``auto`` (the checkpoint folder's file), ``vllm`` (none), or a folder holding one."""
    base = SamplingDefaults(temperature=stage.temperature, top_p=stage.top_p, top_k=stage.top_k,
                            repetition_penalty=stage.repetition_penalty)
    if generation_config == "vllm":
        return base
    source = folder if generation_config == "auto" else Path(generation_config)
    return replace(base, **_from_file(source / GENERATION_CONFIG))
