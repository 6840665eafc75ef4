"""A deterministic stand-in for the pipeline, satisfying ``OmniEngine``.

Each request yields one word per delta and, when speech is asked for, a
440 Hz sine chunk per delta; the last delta is finished with a usage count.
The engine records every request, every abort and every closed stream, so
tests can check what reached it and that abandoned requests were aborted.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import numpy as np
from PIL import Image

from omnistage.engine.logprobs import TokenLogprob
from omnistage.families.speech import SpeechFrontEnd
from omnistage.audio_spec import AudioSpec, Codebooks
from omnistage.core import FinishReason, OmniOutput, OmniRequest, Usage
from omnistage.families.base import FrontEnd
from omnistage.pipeline.reports import (
    EngineStats,
    HealthReport,
    ReplicaHealth,
    ReplicaStats,
    StageHealth,
)
from omnistage.families.qwen3_omni.prompt import Qwen3OmniPrompt, Qwen3OmniPromptProcessor
from omnistage.families.qwen3_omni.voices import OPENAI_VOICES
from omnistage.processing.video import Video
from omnistage.sampling_params import SamplingParams

WORDS: tuple[str, ...] = ("Hello", " from", " the", " fake", " engine", ".")
SINE_HZ = 440.0


class RecordingProcessor(Qwen3OmniPromptProcessor):
    """The real processor, remembering the decoded media it was given (audio at 16 kHz)."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)
        self.seen_audios: list[np.ndarray] = []
        self.seen_images: list[Image.Image] = []
        self.seen_videos: list[Video] = []

    def process(self, token_ids: list[int], audios: list[np.ndarray] = (), images: list = (),
                videos: list[Video] = (), use_audio_in_video: bool = False) -> Qwen3OmniPrompt:
        self.seen_audios.extend(audios)
        self.seen_images.extend(images)
        self.seen_videos.extend(videos)
        return super().process(token_ids, audios=audios, images=images, videos=videos,
                               use_audio_in_video=use_audio_in_video)


# Qwen3-Omni's audio: 12.5 Hz frames of 16 codebooks, 24 kHz out.
AUDIO = AudioSpec(24000, 1920, Codebooks(16, 2048))


def fake_front_end(processor: Qwen3OmniPromptProcessor | None, speech: SpeechFrontEnd | None = None,
                   audio: AudioSpec = AUDIO) -> FrontEnd:
    """A Qwen3-Omni-like front end: the real processor, its three voices and OpenAI's names for them."""
    tokenizer = processor.tokenizer if processor is not None else None
    return FrontEnd(tokenizer, processor, ("Chelsie", "Ethan", "Aiden"), 2048, audio, speech,
                    openai_voices=dict(OPENAI_VOICES))


def sine_chunk(index: int, seconds: float, rate: int = AUDIO.sample_rate) -> np.ndarray:
    """Chunk ``index`` of one continuous 440 Hz tone at ``rate``."""
    n = int(seconds * rate)
    t = (np.arange(n) + index * n) / rate
    return (0.3 * np.sin(2 * np.pi * SINE_HZ * t)).astype(np.float32)


@dataclass
class FakeEngine:
    front_end: FrontEnd
    model_name: str = "fake-omni"
    supports_audio: bool = True
    max_model_len: int = 2048
    default_sampling: SamplingParams = field(default_factory=SamplingParams)
    # Knobs a test may turn (reset() restores them).
    words: tuple[str, ...] = WORDS
    delay_s: float = 0.0
    chunk_seconds: float = 0.1
    fail_with: str | None = None
    healthy: bool = True
    # What the engine saw.
    requests: list[OmniRequest] = field(default_factory=list)
    aborted: list[str] = field(default_factory=list)
    closed: list[str] = field(default_factory=list)
    shut_down: bool = False

    def reset(self) -> None:
        self.words, self.delay_s, self.chunk_seconds = WORDS, 0.0, 0.1
        self.fail_with, self.healthy, self.supports_audio = None, True, True
        self.requests.clear()
        self.aborted.clear()
        self.closed.clear()

    async def generate(self, request: OmniRequest) -> AsyncIterator[OmniOutput]:
        self.requests.append(request)
        n = min(len(self.words), request.sampling.max_tokens)
        try:
            for i in range(n):
                await asyncio.sleep(self.delay_s)
                if request.request_id in self.aborted:
                    return
                yield self._output(request, i, n)
        finally:
            self.closed.append(request.request_id)

    def _output(self, request: OmniRequest, i: int, n: int) -> OmniOutput:
        rate = self.front_end.audio.sample_rate if self.front_end.audio is not None else AUDIO.sample_rate
        audio = sine_chunk(i, self.chunk_seconds, rate) if request.streams_audio else None  # prefill-only: none
        k = request.sampling.logprobs
        # Token i+1 at log-probability -(i+1)/10, its alternatives the next ids, each 0.5 less likely.
        logprobs = () if k is None else (TokenLogprob(i + 1, -(i + 1) / 10, tuple(
            (i + 1 + j, -(i + 1) / 10 - 0.5 * j) for j in range(k))),)
        if i < n - 1:
            return OmniOutput(request.request_id, text=self.words[i], token_ids=(i + 1,), audio=audio,
                              logprobs=logprobs)
        usage = Usage(prompt_tokens=len(request.prompt.token_ids), completion_tokens=n)
        if self.fail_with is not None:
            return OmniOutput(request.request_id, finished=True, finish_reason=FinishReason.ERROR,
                              error=self.fail_with, usage=usage)
        reason = FinishReason.STOP if n == len(self.words) else FinishReason.LENGTH
        return OmniOutput(request.request_id, text=self.words[i], token_ids=(i + 1,), audio=audio, finished=True,
                          finish_reason=reason, usage=usage, logprobs=logprobs)

    async def abort(self, request_id: str) -> None:
        self.aborted.append(request_id)

    def feed(self, request_id: str, delta: object) -> None:
        raise AssertionError("the fake engine's front end takes no text deltas")

    def health(self) -> HealthReport:
        talker = (ReplicaHealth(0, True), ReplicaHealth(1, self.healthy, "" if self.healthy else "process died"))
        return HealthReport(stages=(
            StageHealth("thinker", (ReplicaHealth(0, self.healthy, "" if self.healthy else "process died",
                                                  kv_blocks_total=100, kv_cache_bytes=101 * 4096),)),
            StageHealth("talker", talker),
            StageHealth("code2wav", (ReplicaHealth(0, True),)),
        ))

    def stats(self) -> EngineStats:
        return EngineStats(replicas=(
            ReplicaStats("thinker", 0, kv_blocks_used=12, kv_blocks_total=100, queue_depth=2, running=1,
                         kv_cache_bytes=101 * 4096),
            ReplicaStats("talker", 0, kv_blocks_used=3, kv_blocks_total=50, queue_depth=0, running=1),
            ReplicaStats("talker", 1, kv_blocks_used=0, kv_blocks_total=50, queue_depth=0, running=0),
            ReplicaStats("code2wav", 0, kv_blocks_used=0, kv_blocks_total=0, queue_depth=1, running=0),
        ))

    async def shutdown(self) -> None:
        self.shut_down = True
