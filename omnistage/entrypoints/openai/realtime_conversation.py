"""A realtime session's conversation: its turns, the prompt they render to, and the input audio buffer."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from omnistage.audio import resample
from omnistage.entrypoints.openai.decode_pool import CancelToken
from omnistage.entrypoints.openai.realtime_protocol import EventError
from omnistage.processing.prompt import AUDIO_SAMPLE_RATE, ProcessedPrompt, PromptProcessor


@dataclass(frozen=True)
class Turn:
    """One conversation item: a user's audio (16 kHz float) or text, or an assistant's answer text."""

    item_id: str
    role: str
    text: str = ""
    audio: np.ndarray | None = None


def render_prompt(processor: PromptProcessor, instructions: str, turns: list[Turn]) -> ProcessedPrompt:
    """The conversation as the thinker's prompt; turn N's prompt is a prefix-extension of turn N-1's."""
    messages: list[dict[str, object]] = [{"role": "system", "content": instructions}] if instructions else []
    audios: list[np.ndarray] = []
    for turn in turns:
        if turn.audio is not None:
            audios.append(turn.audio)
            messages.append({"role": turn.role, "content": [{"type": "audio"}]})
        else:
            messages.append({"role": turn.role, "content": turn.text})
    return processor.process(processor.apply_chat_template(messages), audios=audios)


def render_prompt_job(processor: PromptProcessor, instructions: str, turns: list[Turn],
                      token: CancelToken) -> ProcessedPrompt:
    """``render_prompt`` as a ``DecodePool`` job."""
    token.check()
    return render_prompt(processor, instructions, turns)


class InputBuffer:
    """PCM16 pieces at the session's input rate, with the VAD (when on) watching them arrive."""

    def __init__(self, rate: int, max_seconds: float) -> None:
        self.rate = rate
        self.max_samples = int(max_seconds * rate)
        self.pieces: list[np.ndarray] = []
        self.samples = 0

    def append(self, pcm: bytes) -> np.ndarray:
        piece = np.frombuffer(pcm, dtype="<i2").astype(np.float32) / 32768.0
        if self.samples + len(piece) > self.max_samples:
            limit = self.max_samples / self.rate
            raise EventError("input_audio_buffer_too_long",
                             f"the input audio buffer would exceed {limit:g} s; commit or clear it", "audio")
        self.pieces.append(piece)
        self.samples += len(piece)
        return piece

    def take(self, start: int = 0) -> np.ndarray:
        """The buffered audio from sample ``start``, resampled to 16 kHz; the buffer is emptied."""
        audio = np.concatenate(self.pieces)[start:] if self.pieces else np.zeros(0, np.float32)
        self.clear()
        return resample(audio, self.rate, AUDIO_SAMPLE_RATE)

    def clear(self) -> None:
        self.pieces, self.samples = [], 0
