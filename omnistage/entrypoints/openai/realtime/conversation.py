"""A realtime session's prompt and input audio: the items rendered with the chat template, and the input buffer.

Items render in order: system/user/assistant messages as turns (a user's audio as
an audio part), a run of ``function_call`` items as the assistant turn's
``tool_calls``, each ``function_call_output`` as a ``tool`` turn; the session's
tools are shown by the template as for chat completions. Turn N's prompt is a
prefix-extension of turn N-1's, so the thinker's prefix cache skips the earlier turns.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import numpy as np

from omnistage.entrypoints.openai.common.decode_pool import CancelToken, DecodePool
from omnistage.entrypoints.openai.realtime.items import Item
from omnistage.entrypoints.openai.realtime.audio_formats import InputFormat
from omnistage.entrypoints.openai.realtime.budget import SAMPLE_BYTES, SessionMeter
from omnistage.entrypoints.openai.realtime.event_error import EventError
from omnistage.processing.listened_audio import ListenedAudio
from omnistage.processing.prompt import ProcessedPrompt, PromptProcessor


@dataclass(frozen=True)
class PromptSpec:
    """What one response's prompt is made of; ``tools`` in the chat template's shape."""

    instructions: str
    items: tuple[Item, ...]
    tools: list[dict[str, Any]] | None = None
    assistant_prefix: str = ""


def chat_tools(tools: tuple[dict[str, Any], ...]) -> list[dict[str, Any]]:
    """Realtime's flat function tools in chat completions' shape (what the template renders)."""
    return [{"type": "function", "function": {k: t[k] for k in ("name", "description", "parameters") if k in t}}
            for t in tools]


def _arguments(text: str) -> object:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def _messages(spec: PromptSpec) -> tuple[list[dict[str, Any]], list[np.ndarray | ListenedAudio], list[object]]:
    """The template's messages, and the audios and images their placeholders stand for, in order."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": spec.instructions}] if spec.instructions else []
    audios: list[np.ndarray | ListenedAudio] = []
    images: list[object] = []
    for item in spec.items:
        if item.type == "function_call":
            call = {"id": item.call_id, "type": "function",
                    "function": {"name": item.name, "arguments": _arguments(item.arguments)}}
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant":
                last.setdefault("tool_calls", []).append(call)
            else:
                messages.append({"role": "assistant", "content": "", "tool_calls": [call]})
        elif item.type == "function_call_output":
            messages.append({"role": "tool", "tool_call_id": item.call_id, "content": item.output})
        elif item.audio is not None or item.images:
            images.extend(item.images)
            parts: list[dict[str, str]] = [{"type": "image"} for _ in item.images]
            if item.audio is not None:
                audios.append(item.listened or item.audio)  # streamed input: the frames its prefill used
                parts.append({"type": "audio"})
            if item.text:
                parts.append({"type": "text", "text": item.text})
            messages.append({"role": item.role, "content": parts})
        else:
            messages.append({"role": item.role, "content": item.text})
    return messages, audios, images


def render_prompt(processor: PromptProcessor, spec: PromptSpec) -> ProcessedPrompt:
    messages, audios, images = _messages(spec)
    ids = processor.apply_chat_template(messages, spec.tools, assistant_prefix=spec.assistant_prefix)
    return processor.process(ids, audios=audios, images=images)


def render_prompt_job(processor: PromptProcessor, spec: PromptSpec, token: CancelToken) -> ProcessedPrompt:
    """``render_prompt`` as a ``DecodePool`` job."""
    token.check()
    return render_prompt(processor, spec)


def _slice_16k(pieces: list[np.ndarray], start: int, end: int | None, fmt: InputFormat,
               token: CancelToken) -> np.ndarray:
    audio = np.concatenate(pieces)[start:end] if pieces else np.zeros(0, np.float32)
    return fmt.to_16k(audio)


class InputBuffer:
    """Input audio pieces at the session's input format and rate, with the VAD (when on) watching them arrive;
    with a ``meter``, charged to the server's realtime budget (``budget.py``) as they are held."""

    def __init__(self, fmt: InputFormat, max_seconds: float, meter: SessionMeter | None = None) -> None:
        self.format = fmt
        self.max_seconds = max_seconds
        self.meter = meter
        self.pieces: list[np.ndarray] = []
        self.samples = 0
        self.dropped = 0  # samples dropped from the front since the last clear: positions stay the VAD's

    @property
    def rate(self) -> int:
        return self.format.rate

    @property
    def max_samples(self) -> int:
        return int(self.max_seconds * self.rate)

    def append(self, raw: bytes) -> np.ndarray:
        return self.append_samples(self.format.decode(raw))

    def append_samples(self, piece: np.ndarray) -> np.ndarray:
        """Float32 samples already at this buffer's rate (a WebRTC microphone)."""
        if self.samples + len(piece) > self.max_samples:
            raise EventError("input_audio_buffer_too_long",
                             f"the input audio buffer would exceed {self.max_seconds:g} s; commit or clear it", "audio")
        self._hold(self.samples + len(piece))
        self.pieces.append(piece)
        self.samples += len(piece)
        return piece

    def _hold(self, samples: int) -> None:
        """Charges (or refunds) the budget for holding ``samples`` from now on."""
        if self.meter is not None and samples != self.samples:
            change = (samples - self.samples) * SAMPLE_BYTES
            if change > 0:
                self.meter.charge(change, param="audio")
            else:
                self.meter.refund(-change)

    def take(self, start: int = 0, end: int | None = None) -> np.ndarray:
        """The buffered audio in samples ``[start, end)`` (counted since the last clear), at 16 kHz; the buffer is
        emptied."""
        start, end = max(0, start - self.dropped), None if end is None else max(0, end - self.dropped)
        audio = np.concatenate(self.pieces)[start:end] if self.pieces else np.zeros(0, np.float32)
        self.clear()
        return self.format.to_16k(audio)

    async def take_in(self, pool: DecodePool, start: int = 0) -> np.ndarray:
        """``take`` with the joining and resampling in ``pool``: 600 s of audio takes ~0.6 s, which on the event
        loop stalled every session and request (a long one runs as the pool's large jobs do, one at a time). The
        buffer is emptied at once, before the job runs."""
        start = max(0, start - self.dropped)
        self._hold(0)
        pieces, self.pieces, self.samples, self.dropped = self.pieces, [], 0, 0
        return await pool.run_sized(sum(p.nbytes for p in pieces), _slice_16k, pieces, start, None,
                                     self.format)

    async def copy_in(self, pool: DecodePool, start: int, end: int) -> np.ndarray:
        """Samples ``[start, end)`` at 16 kHz, joined in ``pool`` as ``take_in`` does; the buffer keeps them (a
        speculative reply's item, which the turn may still go on from)."""
        start, end = max(0, start - self.dropped), max(0, end - self.dropped)
        pieces = list(self.pieces)
        return await pool.run_sized(sum(p.nbytes for p in pieces), _slice_16k, pieces, start, end, self.format)

    def keep_last(self, samples: int) -> None:
        """Drops all but the latest ``samples`` (a microphone that never stops: what no turn will need)."""
        excess = self.samples - max(0, samples)
        if excess <= 0:
            return
        audio = np.concatenate(self.pieces)[excess:]
        self._hold(len(audio))
        self.pieces, self.samples, self.dropped = [audio], len(audio), self.dropped + excess

    def clear(self) -> None:
        self._hold(0)
        self.pieces, self.samples, self.dropped = [], 0, 0
