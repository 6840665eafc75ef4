"""What the chat front end needs from a model family's prompt preparation, whatever the family.

The chat, realtime and speech layers are written against :class:`PromptProcessor` (render a conversation with
the family's chat template, then expand its media into the prompt the family's entry stage takes) and the
:class:`ProcessedPrompt` it returns; each family implements them in its own package (Qwen3-Omni:
``families/qwen3_omni/prompt.py``) and hands its processor over through ``FrontEnd.processor``. Nothing here
imports a family or torch.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

import numpy as np

from omnistage.processing.video import Video

# Audio reaches every processor as 16 kHz mono float32 (the rate of the Whisper-style feature extractors of
# the omni families); the front end decodes and resamples to it.
AUDIO_SAMPLE_RATE = 16000


@runtime_checkable
class ProcessedPrompt(Protocol):
    """A request's prompt as the family made it: its token ids (placeholders expanded), plus whatever inputs
    the family's entry stage needs (encoder inputs...), which only the family reads."""

    @property
    def token_ids(self) -> Sequence[int]: ...

    @property
    def num_tokens(self) -> int: ...


@runtime_checkable
class PromptProcessor(Protocol):
    """A family's chat prompt preparation (called from worker threads, never on the event loop)."""

    tokenizer: Any  # a transformers tokenizer (decoding, logprob tokens, special-token ids); None without one

    def apply_chat_template(self, messages: list[dict[str, object]], tools: list[dict[str, object]] | None = None,
                            template_kwargs: Mapping[str, object] | None = None, assistant_prefix: str = "",
                            ) -> list[int]:
        """The conversation as prompt ids with the assistant turn opened (and started with ``assistant_prefix``)."""
        ...

    def process(self, token_ids: list[int], audios: Sequence[np.ndarray] = (), images: Sequence[object] = (),
                videos: Sequence[Video] = (), use_audio_in_video: bool = False) -> ProcessedPrompt:
        """Each media placeholder of ``token_ids`` expanded for its item (audio: 16 kHz mono float32)."""
        ...
