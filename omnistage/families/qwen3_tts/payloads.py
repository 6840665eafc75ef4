"""What only Qwen3-TTS's stages exchange: the talker's start and, while its text is written, the text's later ids
(the generic frames, chunks and audio aside).

The utterance travels as the model's own :class:`PromptSpec` (a dataclass msgspec encodes as it is, its
cloned voice's tensors out of band): it is also the request's prompt in the front end.
"""

from __future__ import annotations

import msgspec

from omnistage.ipc.messages import PayloadTypes
from omnistage.models.qwen3_tts.prompt import PromptSpec
from omnistage.sampling_params import SamplingParams


class TalkerSpeech(msgspec.Struct, tag="qwen3_tts.TalkerSpeech"):
    """The talker's start: the utterance and the talker's sampling."""

    prompt: PromptSpec
    sampling: SamplingParams


class TextAppend(msgspec.Struct, tag="qwen3_tts.TextAppend"):
    """More of an open utterance's text: its next body ids; ``done``: the text ended (after these ids come
    ``tts_eos`` and then ``tts_pad``), and the talker's frames are capped at ``max_frames``. Also the front end's
    :class:`~omnistage.core.PromptDelta` for the request (the pipeline sends it to the talker as it is)."""

    ids: list[int]
    done: bool = False
    tail_tokens: int = 0  # the closing wrapper's ids, counted in the prompt tokens (as the whole text's are)
    max_frames: int | None = None

    @property
    def num_tokens(self) -> int:
        return len(self.ids) + self.tail_tokens


PAYLOADS = PayloadTypes((TalkerSpeech, TextAppend))
