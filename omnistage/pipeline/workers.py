"""The Qwen3-Omni stage workers: thinker, talker and code2wav engines behind wire messages.

Each worker loads only its own stage's weights (the talker also the thinker's
embedding table, which it projects text rows from) and turns wire messages
into the typed pieces of :mod:`omnistage.pipeline.qwen3_omni_stages`, which
does the per-request work; this module only adapts engines to messages.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Generic, TypeVar

import msgspec
import torch

from omnistage.config.pipeline import StageSpec
from omnistage.engine import EngineConfig, EngineCore, FinishReason, Request, RequestOutput, SamplingParams
from omnistage.engine.config import auto_device
from omnistage.engine.generation_engine import ChunkJob, GenerationEngineCore, vocoder_batch_cap
from omnistage.ipc.messages import (
    AudioChunk,
    DecodeChunk,
    FeedText,
    ReplicaInput,
    ReplicaLoad,
    RequestFailed,
    StageOutput,
    StartTalker,
    StartThinker,
    TalkerFrames,
    ThinkerTokens,
    WireSampling,
)
from omnistage.models.qwen3_omni.code2wav import load_code2wav
from omnistage.models.qwen3_omni.decoder import hf_config
from omnistage.models.qwen3_omni.mrope import MRopeTokens
from omnistage.models.qwen3_omni.talker import Talker
from omnistage.pipeline.qwen3_omni_stages import (
    ChunkPlan,
    PromptLayout,
    TalkerContext,
    TalkerTextFeed,
    build_talker_request,
    build_thinker_request,
    code2wav_runner,
    load_thinker_embedding,
    multimodal_hidden,
    talker_frames,
    talker_mrope_tokens,
)
from omnistage.pipeline.sharded_stage import load_thinker
from omnistage.pipeline.stage import StageWorker, StepResult
from omnistage.pipeline.transforms.qwen3_omni import TalkerTokenIds
from omnistage.processing.prompt import MultimodalInputs, ProcessedPrompt
from omnistage.runner import build_ar_engine
from omnistage.runner.thinker_hook import ThinkerRequestData, ThinkerStepHook


@dataclass(frozen=True)
class WorkerSpec:
    """How to build one replica's worker (picklable: it crosses into the spawned process)."""

    model_dir: str
    stage: StageSpec
    seamless_audio: bool = True


def resolve_device(device: str, dtype: str = "auto") -> tuple[str, torch.dtype]:
    device = auto_device(device)
    if dtype != "auto":
        return device, getattr(torch, dtype)
    # bf16 is what the checkpoints ship in; on CPU fp32 is faster and exact.
    return device, (torch.bfloat16 if device.startswith("cuda") else torch.float32)


def engine_config(stage: StageSpec, device: str, dtype: torch.dtype, max_positions: int) -> EngineConfig:
    e = stage.engine
    return EngineConfig(
        block_size=e.block_size, num_blocks=e.num_kv_blocks + 1,  # + the reserved null block
        max_num_seqs=e.max_num_seqs, max_num_batched_tokens=e.max_num_batched_tokens,
        max_model_len=e.model_len(max_positions),
        enable_prefix_caching=e.enable_prefix_caching, device=device, dtype=dtype,
        kv_cache_memory=e.kv_cache_memory, gpu_memory_utilization=e.gpu_memory_utilization,
    )


def sampling_params(wire: WireSampling) -> SamplingParams:
    return SamplingParams(**{f: getattr(wire, f) for f in wire.__struct_fields__})


def kv_load(engine: EngineCore) -> ReplicaLoad:
    sched = engine.scheduler
    total = sched.kv.usable_blocks
    return ReplicaLoad(waiting=len(sched.waiting), running=len(sched.running),
                       kv_blocks_used=total - sched.kv.num_free_blocks, kv_blocks_total=total,
                       kv_block_bytes=getattr(engine.runner, "kv_block_bytes", 0))


def _tensor(x: torch.Tensor | None) -> torch.Tensor | None:
    return None if x is None or x.numel() == 0 else x


_Held = TypeVar("_Held")


class _ARWorker(StageWorker, Generic[_Held]):
    """Shared by thinker and talker: an ``EngineCore`` and what it holds per request."""

    def __init__(self, engine: EngineCore) -> None:
        self.engine = engine
        self.requests: dict[str, _Held] = {}

    def abort(self, request_ids: list[str]) -> None:
        for rid in request_ids:
            self.engine.abort_request(rid)
            self.requests.pop(rid, None)

    def has_work(self) -> bool:
        return self.engine.has_unfinished_requests()

    def load(self) -> ReplicaLoad:
        return kv_load(self.engine)

    def request_ids(self) -> list[str]:
        return list(self.requests)

    def _failed(self, out: RequestOutput) -> RequestFailed:
        """A request the engine ended alone with an error (the engine already freed it)."""
        self.requests.pop(out.request_id, None)
        return RequestFailed(out.request_id, out.error or "the stage failed this request")


class ThinkerWorker(_ARWorker[Request]):
    def __init__(self, spec: WorkerSpec) -> None:
        device, dtype = resolve_device(spec.stage.device, spec.stage.dtype)
        stage = spec.stage
        self.model, self.tp = load_thinker(spec.model_dir, device, dtype, stage.tensor_parallel_size, stage.quantization)
        config = json.loads((Path(spec.model_dir) / "config.json").read_text())
        self.eos_token_id = int(config["im_end_token_id"])
        cfg = self.model.config
        self.multimodal = frozenset((cfg.audio_token_id, cfg.image_token_id, cfg.video_token_id))
        positions = int(cfg.text_config.max_position_embeddings)
        super().__init__(build_ar_engine(self.model, engine_config(spec.stage, device, dtype, positions),
                                         ThinkerStepHook(), tp=self.tp))
        self.awaiting_hidden: set[str] = set()

    def close(self) -> None:
        if self.tp is not None:
            self.tp.close()

    @torch.inference_mode()
    def handle(self, message: ReplicaInput) -> list[StageOutput]:
        if not isinstance(message, StartThinker):
            raise TypeError(f"the thinker does not take {type(message).__name__}")
        mm = MultimodalInputs(**msgspec.structs.asdict(message.mm)) if message.mm else MultimodalInputs()
        prompt = ProcessedPrompt(token_ids=list(message.prompt_token_ids), mm=mm)
        request = build_thinker_request(self.model, message.request_id, prompt, sampling_params(message.sampling),
                                        self.eos_token_id, for_talker=message.capture_hidden)
        self.engine.add_request(request)
        self.requests[message.request_id] = request
        if message.capture_hidden:
            self.awaiting_hidden.add(message.request_id)
        return []

    def step(self) -> StepResult:
        outputs: list[StageOutput] = []
        for out in self.engine.step():
            request = self.requests.get(out.request_id)
            if request is None:
                continue
            if out.finish_reason is FinishReason.ERROR:
                self.awaiting_hidden.discard(out.request_id)
                outputs.append(self._failed(out))
                continue
            msg = ThinkerTokens(out.request_id, out.new_token_ids, out.finished,
                                out.finish_reason.value if out.finish_reason else None, request.num_prompt_tokens,
                                num_cached_tokens=max(request.num_cached_tokens, 0), logprobs=out.logprobs)
            if out.request_id in self.awaiting_hidden:
                msg.mm_hidden = self._take_hidden(request)
            if out.finished:
                self.requests.pop(out.request_id, None)
            outputs.append(msg)
        return StepResult(outputs, progressed=self.engine.last_num_scheduled > 0)

    def _take_hidden(self, request: Request) -> torch.Tensor | None:
        self.awaiting_hidden.discard(request.request_id)
        hidden = multimodal_hidden(request, self.multimodal)
        data = request.stage_data
        if isinstance(data, ThinkerRequestData):
            # The talker needs prompt rows only: stop keeping a hidden row per decoded token.
            data.capture_hidden = False
            data.accept_hidden = []
        return hidden


class TalkerWorker(_ARWorker[TalkerTextFeed]):
    def __init__(self, spec: WorkerSpec) -> None:
        device, dtype = resolve_device(spec.stage.device, spec.stage.dtype)
        folder = spec.model_dir
        talker = Talker.from_checkpoint(folder, device, dtype, spec.stage.quantization)
        full = hf_config(folder)
        mrope = talker_mrope_tokens(talker.config, MRopeTokens.from_thinker_config(full.thinker_config))
        ids = TalkerTokenIds.from_config(json.loads((Path(folder) / "config.json").read_text()))
        self.ctx = TalkerContext(talker, load_thinker_embedding(folder, device, dtype), ids, mrope)
        self.num_groups = talker.num_code_groups
        positions = int(talker.config.text_config.max_position_embeddings)
        super().__init__(build_ar_engine(talker, engine_config(spec.stage, device, dtype, positions),
                                         self.ctx.step_hook()))

    @torch.inference_mode()
    def handle(self, message: ReplicaInput) -> list[StageOutput]:
        if isinstance(message, StartTalker):
            layout = PromptLayout(**msgspec.structs.asdict(message.layout))
            request, feed = build_talker_request(self.ctx, message.request_id, layout, _tensor(message.mm_hidden),
                                                 message.first_token, sampling_params(message.sampling),
                                                 message.voice)
            self.engine.add_request(request)
            self.requests[message.request_id] = feed
        elif isinstance(message, FeedText):
            feed = self.requests.get(message.request_id)
            if feed is not None:  # None: the talker already finished (EOS before the text ran out)
                feed.extend(message.token_ids)
                if message.finished:
                    feed.finish()
        else:
            raise TypeError(f"the talker does not take {type(message).__name__}")
        return []

    def step(self) -> StepResult:
        outputs: list[StageOutput] = []
        for out in self.engine.step():
            if out.finish_reason is FinishReason.ERROR:
                outputs.append(self._failed(out))
                continue
            frames = talker_frames(out)
            if frames is None:
                frames = torch.empty(0, self.num_groups, dtype=torch.long)
            reason = out.finish_reason.value if out.finish_reason else None
            outputs.append(TalkerFrames(out.request_id, frames, out.finished, reason))
            if out.finished:
                self.requests.pop(out.request_id, None)
        return StepResult(outputs, progressed=self.engine.last_num_scheduled > 0)


class Code2WavWorker(StageWorker):
    def __init__(self, spec: WorkerSpec) -> None:
        device, dtype = resolve_device(spec.stage.device, spec.stage.dtype)
        model = load_code2wav(spec.model_dir, device, dtype)
        runner = code2wav_runner(model, ChunkPlan(seamless=spec.seamless_audio), device)
        max_batch = vocoder_batch_cap(spec.stage.engine.max_num_seqs, device)
        self.engine = GenerationEngineCore(runner, max_batch=max_batch, policy=spec.stage.engine.scheduling)
        self.pending: dict[str, int] = {}  # request id → jobs queued

    def handle(self, message: ReplicaInput) -> list[StageOutput]:
        if not isinstance(message, DecodeChunk):
            raise TypeError(f"code2wav does not take {type(message).__name__}")
        job = ChunkJob(message.request_id, message.chunk_index, message.codes, message.left_context, message.is_last,
                       message.deadline)
        self.engine.add_job(job)
        self.pending[message.request_id] = self.pending.get(message.request_id, 0) + 1
        return []

    def abort(self, request_ids: list[str]) -> None:
        for rid in request_ids:
            self.engine.abort_request(rid)
            self.pending.pop(rid, None)

    def has_work(self) -> bool:
        return self.engine.has_pending()

    def step(self) -> StepResult:
        outputs: list[StageOutput] = []
        start = time.perf_counter()
        made = self.engine.step()
        busy = time.perf_counter() - start
        samples = sum(out.wav.numel() for out in made) or 1
        for out in made:
            left = self.pending.get(out.request_id, 1) - 1
            if left > 0:
                self.pending[out.request_id] = left
            else:
                self.pending.pop(out.request_id, None)
            share = busy * out.wav.numel() / samples
            outputs.append(AudioChunk(out.request_id, out.chunk_index, out.wav.float(), out.is_last, share))
        return StepResult(outputs, progressed=bool(outputs))

    def load(self) -> ReplicaLoad:
        return ReplicaLoad(waiting=sum(self.pending.values()), running=len(self.pending))

    def request_ids(self) -> list[str]:
        return list(self.pending)


WORKERS = {"thinker": ThinkerWorker, "talker": TalkerWorker, "code2wav": Code2WavWorker}


def build_worker(spec: WorkerSpec) -> StageWorker:
    """The replica's worker factory (a module-level function, so ``partial(build_worker, spec)`` pickles)."""
    return WORKERS[spec.stage.model](spec)


