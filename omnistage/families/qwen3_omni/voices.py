"""Qwen3-Omni's voices as the API names them: its default speaker, and OpenAI's voice names mapped onto its
speakers (Chelsie is a female voice, Ethan and Aiden male ones; OpenAI's voices matched by their usual pitch).

Light on purpose (no torch): the front end and tests read it without loading the family's models.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

DEFAULT_VOICE = "Ethan"  # transformers' generate(speaker=...) default
OPENAI_VOICES: Mapping[str, str] = MappingProxyType({
    "alloy": "Chelsie", "ash": "Ethan", "ballad": "Aiden", "coral": "Chelsie", "echo": "Ethan",
    "fable": "Aiden", "onyx": "Ethan", "nova": "Chelsie", "sage": "Chelsie", "shimmer": "Chelsie",
    "verse": "Aiden", "marin": "Chelsie", "cedar": "Ethan",
})
