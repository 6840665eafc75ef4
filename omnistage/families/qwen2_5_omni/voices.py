"""Qwen2.5-Omni's voices (``spk_dict.pt``: per speaker its talker text-bos id, the DiT's conditioning vector and
reference mel), its default voice, and the system prompt its talker was trained under.

transformers' ``generate`` speaks in Chelsie unless told otherwise, and neither warns nor refuses when the system
prompt differs; Qwen's model card says audio output needs :data:`SYSTEM_PROMPT` (other prompts may give poor
speech), so the family logs a warning once when audio is asked under another one (as Qwen's own tooling does).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType

import torch

from omnistage.models.qwen2_5_omni.config import SPEAKER_FILE

DEFAULT_VOICE = "Chelsie"
# OpenAI's voice names on its two speakers (Chelsie female, Ethan male), for clients that allow only those.
OPENAI_VOICES: Mapping[str, str] = MappingProxyType({
    "alloy": "Chelsie", "ash": "Ethan", "ballad": "Ethan", "coral": "Chelsie", "echo": "Ethan", "fable": "Ethan",
    "onyx": "Ethan", "nova": "Chelsie", "sage": "Chelsie", "shimmer": "Chelsie", "verse": "Ethan",
    "marin": "Chelsie", "cedar": "Ethan",
})
SYSTEM_PROMPT = ("You are Qwen, a virtual human developed by the Qwen Team, Alibaba Group, capable of perceiving "
                 "auditory and visual inputs, as well as generating text and speech.")


@dataclass(frozen=True)
class Speaker:
    bos_token: int  # the talker's text-bos id for this voice
    cond: torch.Tensor  # [1, enc_emb_dim]: the DiT's speaker conditioning
    ref_mel: torch.Tensor  # [1, frames, mel_dim]: the DiT's reference mel


def load_speakers(folder: str | Path) -> dict[str, Speaker]:
    raw = torch.load(Path(folder) / SPEAKER_FILE, weights_only=True)
    return {name: Speaker(int(v["bos_token"]), v["cond"], v["ref_mel"]) for name, v in raw.items()}


def speaker(speakers: dict[str, Speaker], voice: str) -> Speaker:
    """``voice`` (any case; "": the default) → its speaker."""
    wanted = (voice or DEFAULT_VOICE).lower()
    found = next((s for name, s in speakers.items() if name.lower() == wanted), None)
    if found is None:
        raise ValueError(f"voice {voice!r} is not one of this checkpoint's speakers ({', '.join(speakers)})")
    return found
