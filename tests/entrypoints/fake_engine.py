"""A deterministic stand-in for the pipeline, satisfying ``OmniEngine``.

Each request yields one word per delta and, when speech is asked for, a
440 Hz sine chunk per delta; the last delta is finished with a usage count.
The engine records every request, every abort and every closed stream, so
tests can check what reached it and that abandoned requests were aborted.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field

import numpy as np
from PIL import Image

from omnistage.engine.logprobs import TokenLogprob
from omnistage.families.speech import SpeechFrontEnd
from omnistage.core import OUTPUT_SAMPLE_RATE, FinishReason, OmniOutput, OmniRequest, Usage
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


def sine_chunk(index: int, seconds: float) -> np.ndarray:
    """Chunk ``index`` of one continuous 440 Hz tone at 24 kHz."""
    n = int(seconds * OUTPUT_SAMPLE_RATE)
    t = (np.arange(n) + index * n) / OUTPUT_SAMPLE_RATE
    return (0.3 * np.sin(2 * np.pi * SINE_HZ * t)).astype(np.float32)


@dataclass
class FakeEngine:
    processor: Qwen3OmniPromptProcessor
    model_name: str = "fake-omni"
    voices: tuple[str, ...] = ("Chelsie", "Ethan", "Aiden")
    openai_voices: Mapping[str, str] = field(default_factory=lambda: dict(OPENAI_VOICES))
    default_voice: str = ""
    supports_audio: bool = True
    speech: SpeechFrontEnd | None = None
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
        audio = sine_chunk(i, self.chunk_seconds) if request.streams_audio else None  # prefill-only: none
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
