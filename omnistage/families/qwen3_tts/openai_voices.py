"""OpenAI's voice names on a Qwen3-TTS CustomVoice checkpoint's speakers (female names on Vivian, male ones on
Ryan, the lighter male ones on Aiden), so clients that allow only OpenAI's names (pipecat...) still choose a
voice; a checkpoint lacking the named speaker falls back to its first one. Light: no torch."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

OPENAI_VOICES: Mapping[str, str] = MappingProxyType({
    "alloy": "vivian", "ash": "ryan", "ballad": "aiden", "coral": "vivian", "echo": "ryan", "fable": "aiden",
    "onyx": "ryan", "nova": "vivian", "sage": "vivian", "shimmer": "vivian", "verse": "aiden", "marin": "vivian",
    "cedar": "ryan",
})
