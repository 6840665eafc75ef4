"""The codec stage of any family: chunk jobs of many requests decoded in batches, audio chunks out.

A family's codec worker only says how to load its vocoder (:meth:`CodecWorker.load_vocoder`); batching, the
playback-deadline order, per-stream state and the load a replica reports are the same for all. Chunk jobs come
straight from the talker replica, aborts from the orchestrator: a job still on its way when its request was
aborted arrives after the abort, and is dropped (``ABORTED_KEPT`` ids remembered).
"""

from __future__ import annotations

import time
from abc import abstractmethod
from collections import OrderedDict

import torch

from omnistage.engine.generation_engine import (
    ChunkDecoder,
    ChunkJob,
    ChunkOutput,
    GenerationEngineCore,
    vocoder_batch_cap,
)
from omnistage.ipc.messages import ReplicaLoad, RequestFailed, StageInput, StageOutput
from omnistage.ipc.payloads import AudioChunk
from omnistage.workers.base import StageWorker, StepResult, WorkerSpec, resolve_device


# Aborted request ids a codec replica remembers: far more than the chunks that can be on their way at once.
ABORTED_KEPT = 4096


class CodecWorker(StageWorker):
    def __init__(self, spec: WorkerSpec) -> None:
        device, dtype = resolve_device(spec.stage.device, spec.stage.dtype)
        max_batch = vocoder_batch_cap(spec.stage.engine, device)
        self.engine = GenerationEngineCore(self.load_vocoder(spec, device, dtype), max_batch=max_batch,
                                           policy=spec.stage.engine.scheduling)
        self.pending: dict[str, int] = {}  # request id → jobs queued
        self.aborted: OrderedDict[str, None] = OrderedDict()  # recently aborted ids, oldest first
        self.last_made: list[ChunkOutput] = []  # the chunks the last step decoded

    @abstractmethod
    def load_vocoder(self, spec: WorkerSpec, device: str, dtype: torch.dtype) -> ChunkDecoder:
        """The family's vocoder behind a ``GenerationRunner`` on ``device``."""

    def handle(self, message: StageInput) -> list[StageOutput | RequestFailed]:
        job = message.payload
        if not isinstance(job, ChunkJob):
            raise TypeError(f"a codec stage does not take {type(job).__name__}")
        if job.request_id in self.aborted:
            return []  # the talker sent it before it heard of the abort
        self.engine.add_job(job, time.monotonic())
        self.pending[job.request_id] = self.pending.get(job.request_id, 0) + 1
        return []

    def abort(self, request_ids: list[str]) -> None:
        for rid in request_ids:
            self.engine.abort_request(rid)
            self.pending.pop(rid, None)
            self.aborted[rid] = None
        while len(self.aborted) > ABORTED_KEPT:
            self.aborted.popitem(last=False)

    def has_work(self) -> bool:
        return self.engine.has_pending()

    def step(self) -> StepResult:
        outputs: list[StageOutput | RequestFailed] = []
        start = time.perf_counter()
        made = self.engine.step()
        busy = time.perf_counter() - start
        self.last_made = made
        samples = sum(out.wav.numel() for out in made) or 1
        for out in made:
            left = self.pending.get(out.request_id, 1) - 1
            if left > 0:
                self.pending[out.request_id] = left
            else:
                self.pending.pop(out.request_id, None)
            share = busy * out.wav.numel() / samples
            chunk = AudioChunk(out.chunk_index, out.wav.float(), out.is_last, share)
            outputs.append(StageOutput(out.request_id, chunk, finished=out.is_last))
        return StepResult(outputs, progressed=bool(outputs))

    def load(self) -> ReplicaLoad:
        return ReplicaLoad(waiting=sum(self.pending.values()), running=len(self.pending))

    def request_ids(self) -> list[str]:
        return list(self.pending)

    def scheduled_ids(self) -> list[str]:
        return [out.request_id for out in self.last_made]
