"""The family's preset, shrunk for the tiny checkpoint: a greedy talker of a few codes (so the pipeline's audio can
be held against the offline path)."""

from __future__ import annotations

from pathlib import Path

import yaml

from omnistage.families.qwen2_5_omni.family import PRESET

TALKER_TOKENS = 16


def small_spec(folder: Path) -> Path:
    data = yaml.safe_load(PRESET.read_text())
    thinker, talker, _ = data["stages"]
    thinker["engine"].update(num_kv_blocks=64)
    talker["engine"].update(num_kv_blocks=64)
    talker["sampling"].update(temperature=0.0, max_tokens=TALKER_TOKENS)
    path = folder / "qwen2_5_omni_small.yaml"
    path.write_text(yaml.safe_dump(data))
    return path
