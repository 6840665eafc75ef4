"""Qwen2.5-Omni's typed config: config.json (and generation_config.json's EOS) parsed once, passed down."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

MODEL_TYPE = "qwen2_5_omni"
SPEAKER_FILE = "spk_dict.pt"


@dataclass(frozen=True)
class Qwen25OmniConfig:
    """hf: transformers' ``Qwen2_5OmniConfig``; eos_token_ids: what ends the thinker's reply (``<|im_end|>``);
    has_talker: the checkpoint can speak (``enable_audio_output`` and a speaker file)."""

    folder: Path
    hf: object
    eos_token_ids: tuple[int, ...]
    has_talker: bool

    @classmethod
    def from_folder(cls, folder: str | Path) -> Qwen25OmniConfig:
        from transformers import Qwen2_5OmniConfig

        folder = Path(folder)
        hf = Qwen2_5OmniConfig.from_pretrained(folder)
        talker = bool(hf.enable_audio_output) and (folder / SPEAKER_FILE).is_file()
        return cls(folder, hf, _eos_ids(folder), talker)

    @property
    def max_positions(self) -> int:
        return int(self.hf.thinker_config.text_config.max_position_embeddings)

    @property
    def eos_token_id(self) -> int | None:
        return self.eos_token_ids[0] if self.eos_token_ids else None


def _eos_ids(folder: Path) -> tuple[int, ...]:
    path = folder / "generation_config.json"
    if not path.is_file():
        return ()
    eos = json.loads(path.read_text()).get("eos_token_id")
    return tuple(eos) if isinstance(eos, list) else (() if eos is None else (int(eos),))
