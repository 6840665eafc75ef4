"""The thinker's sampling when a request leaves a knob unset, as vLLM picks it.

vLLM applies the checkpoint's ``generation_config.json`` to every knob a request
leaves out (``--generation-config auto``); here the stage config's ``sampling:``
(the preset's thinker: greedy) is the base, the checkpoint's file wins over it
for the keys it sets, and the request wins over both. ``--generation-config vllm``
ignores the checkpoint's file (vLLM's spelling), a folder reads that folder's.
"""

from __future__ import annotations

import json
from pathlib import Path

import msgspec

from omnistage.sampling_params import SamplingParams

GENERATION_CONFIG = "generation_config.json"


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


def sampling_defaults(stage: SamplingParams, folder: Path, generation_config: str = "auto") -> SamplingParams:
    """The entry stage's sampling, but ``max_tokens``: None (a request's room in the context) unless the
    checkpoint's file sets ``max_new_tokens``; a stage's own cap bounds its talker or the Python API's requests, not
    the server's. ``generation_config``: ``auto`` (the checkpoint folder's file), ``vllm`` (none), or a folder
    holding one."""
    base = msgspec.structs.replace(stage, max_tokens=None)
    if generation_config == "vllm":
        return base
    source = folder if generation_config == "auto" else Path(generation_config)
    try:
        return msgspec.structs.replace(base, **_from_file(source / GENERATION_CONFIG))
    except ValueError as exc:
        raise ValueError(f"{source / GENERATION_CONFIG}: {exc}") from None
