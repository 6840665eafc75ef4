"""``omnistage make-tiny --model-type qwen2_5_omni --plain``: the tiny checkpoint's config with transformers' own
random init, the case verify must pass on margins nobody chose.

The tiny (:mod:`make_tiny`) makes greedy choices robust: a confident thinker head and a wide talker codec head.
Robust margins also hide a real difference (one that moves logits by 1e-2 flips no code whose gap is ~1), so the
weights here are ``Qwen2_5OmniForConditionalGeneration(config)`` under ``torch.manual_seed(seed)``, nothing
touched, saved beside the tiny's tokenizer, processor configs, generation config and ``spk_dict.pt``. Config
entries can be changed first (another depth, other head counts) by dotted path.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

import torch
from safetensors.torch import save_file

from omnistage.families.qwen2_5_omni.make_tiny import make_tiny

PLAIN_SEED = 13


def make_plain(out_dir: str | Path, seed: int = PLAIN_SEED, overrides: Mapping[str, object] | None = None) -> Path:
    """Writes the plainly initialised checkpoint into ``out_dir``; ``overrides``: config.json entries by dotted
    path, e.g. ``{"talker_config.num_hidden_layers": 3}``."""
    from transformers import Qwen2_5OmniConfig, Qwen2_5OmniForConditionalGeneration

    out = make_tiny(out_dir)
    config_file = out / "config.json"
    config = json.loads(config_file.read_text())
    for path, value in (overrides or {}).items():
        _set(config, path, value)
    config_file.write_text(json.dumps(config, indent=2, sort_keys=True))
    torch.manual_seed(seed)
    model = Qwen2_5OmniForConditionalGeneration(Qwen2_5OmniConfig.from_pretrained(out)).eval()
    state = {name: t.detach().contiguous() for name, t in sorted(model.state_dict().items())}
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    return out


def parse_overrides(items: list[str]) -> dict[str, object]:
    """``KEY=VALUE`` strings (VALUE read as JSON, else kept as a string) → overrides."""
    overrides: dict[str, object] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"--set takes KEY=VALUE (a dotted config.json path), not {item!r}")
        try:
            overrides[key] = json.loads(value)
        except json.JSONDecodeError:
            overrides[key] = value
    return overrides


def _set(config: dict[str, object], path: str, value: object) -> None:
    *parents, leaf = path.split(".")
    node = config
    for name in parents:
        child = node.get(name)
        if not isinstance(child, dict):
            raise KeyError(f"config.json has no section {name!r} on the way to {path!r}")
        node = child
    if leaf not in node:
        raise KeyError(f"config.json has no entry {path!r}")
    node[leaf] = value
