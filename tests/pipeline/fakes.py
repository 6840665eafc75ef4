"""Stage workers without models: deterministic stand-ins with the real stages' message behaviour.

The fake thinker emits token ``100 + i`` per step; the fake talker makes one
frame per step while it has text (like the real one, it waits for the next
token), each frame's codes recording the request's step number; the fake
code2wav turns each new frame into ``SAMPLES_PER_FRAME`` samples of its code.
Every instance records the messages it saw, so routing can be checked.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field

import torch

from omnistage.audio_spec import AudioSpec, Codebooks
from omnistage.engine import FinishReason
from omnistage.engine.generation_engine import ChunkJob
from omnistage.families.qwen3_omni.payloads import TalkerStart, TextFeed, ThinkerPrompt
from omnistage.ipc.messages import ReplicaLoad, StageInput, StageOutput
from omnistage.ipc.payloads import AudioChunk, CodecFrames, TokenDelta
from omnistage.workers.base import StageWorker, StepResult

GROUPS = 2
SAMPLES_PER_FRAME = 4
# The fakes' audio: 12.5 Hz frames of GROUPS codebooks, each frame SAMPLES_PER_FRAME samples (so 50 Hz output).
AUDIO = AudioSpec(50, SAMPLES_PER_FRAME, Codebooks(GROUPS, 4096))
INSTANCES: list[StageWorker] = []  # in-process replicas register here (tests inspect them)


@dataclass
class _Seq:
    limit: int
    made: int = 0
    text: int = 0
    text_done: bool = False


@dataclass
class FakeBase(StageWorker):
    step_s: float = 0.0
    seqs: dict[str, _Seq] = field(default_factory=dict)
    seen: list[tuple[str, str]] = field(default_factory=list)  # (message type, request id)

    def __post_init__(self) -> None:
        INSTANCES.append(self)

    def abort(self, request_ids: list[str]) -> None:
        for rid in request_ids:
            self.seen.append(("abort", rid))
            self.seqs.pop(rid, None)

    def has_work(self) -> bool:
        return bool(self.seqs)

    def load(self) -> ReplicaLoad:
        return ReplicaLoad(running=len(self.seqs), kv_blocks_used=len(self.seqs), kv_blocks_total=100)

    def request_ids(self) -> list[str]:
        return list(self.seqs)


@dataclass
class FakeThinker(FakeBase):
    fail_on: str = ""  # a request id whose start raises (a bad input)
    crash_on: str = ""  # a request id whose first step raises (a broken step)
    exit_on: str = ""  # a request id whose start ends the replica's process

    def handle(self, message: StageInput) -> list[StageOutput]:
        assert isinstance(message.payload, ThinkerPrompt)
        if message.request_id == self.fail_on:
            raise ValueError("boom")
        if message.request_id == self.exit_on:
            os._exit(3)
        self.seen.append(("start", message.request_id))
        self.seqs[message.request_id] = _Seq(message.payload.sampling.max_tokens)
        return []

    def step(self) -> StepResult:
        time.sleep(self.step_s)
        if self.crash_on in self.seqs:
            raise RuntimeError("step crashed")
        outs: list[StageOutput] = []
        for rid, seq in list(self.seqs.items()):
            seq.made += 1
            done = seq.made >= seq.limit
            outs.append(StageOutput(rid, TokenDelta([100 + seq.made], num_prompt_tokens=3), done,
                                    FinishReason.LENGTH if done else None))
            if done:
                del self.seqs[rid]
        return StepResult(outs)


@dataclass
class FakeTalker(FakeBase):
    step_s_per_seq: float = 0.0  # a talker whose step slows with its batch (one that does not batch)
    spoken: dict[str, list[int]] = field(default_factory=dict)  # the thinker tokens each request was fed

    def handle(self, message: StageInput) -> list[StageOutput]:
        payload = message.payload
        self.seen.append((type(payload).__name__, message.request_id))
        if isinstance(payload, TalkerStart):
            self.seqs[message.request_id] = _Seq(payload.sampling.max_tokens, text=1)
            self.spoken[message.request_id] = [payload.first_token]
        elif isinstance(payload, TextFeed) and message.request_id in self.seqs:
            self.spoken[message.request_id].extend(payload.token_ids)
            seq = self.seqs[message.request_id]
            seq.text += len(payload.token_ids)
            seq.text_done = seq.text_done or payload.finished
        return []

    def step(self) -> StepResult:
        time.sleep(self.step_s + self.step_s_per_seq * len(self.seqs))
        outs: list[StageOutput] = []
        for rid, seq in list(self.seqs.items()):
            if seq.made >= seq.text and not seq.text_done:
                continue  # waits for text, as the real talker does
            seq.made += 1
            done = seq.made >= seq.limit
            frame = torch.full((1, GROUPS), seq.made, dtype=torch.long)
            outs.append(StageOutput(rid, CodecFrames(frame), done, FinishReason.LENGTH if done else None))
            if done:
                del self.seqs[rid]
        return StepResult(outs, progressed=bool(outs))


class FakeCode2Wav(FakeBase):
    def handle(self, message: StageInput) -> list[StageOutput]:
        job = message.payload
        assert isinstance(job, ChunkJob)
        self.seen.append(("chunk", message.request_id))
        new = job.codes[0, job.left_context + job.discard_frames:].float()
        wav = new.repeat_interleave(SAMPLES_PER_FRAME)
        return [StageOutput(message.request_id, AudioChunk(job.chunk_index, wav, job.is_last), finished=job.is_last)]

    def step(self) -> StepResult:
        return StepResult([], progressed=False)


def broken_factory() -> StageWorker:
    raise OSError("weights not found")


def fake_factories(thinker_step_s: float = 0.0, talker_step_s: float = 0.0, talker_step_s_per_seq: float = 0.0,
                   **thinker: str) -> dict[str, object]:
    from functools import partial

    return {"thinker": partial(FakeThinker, step_s=thinker_step_s, **thinker),
            "talker": partial(FakeTalker, step_s=talker_step_s, step_s_per_seq=talker_step_s_per_seq),
            "code2wav": FakeCode2Wav}


def omni_graph(spec):  # noqa: ANN001, ANN201 - PipelineSpec -> StageGraph
    """A stage config resolved through the real Qwen3-Omni family (its edges; the workers are the fakes)."""
    from omnistage.families.registry import DEFAULT_REGISTRY
    from omnistage.pipeline.graph import resolve_graph

    return resolve_graph(spec, DEFAULT_REGISTRY.family("qwen3_omni"))
