"""What one request needs to cross Qwen3-Omni's stages: thinker → talker → code2wav.

Shared by the streaming pipeline (a stage builds these from what crossed its
boundary) and by :func:`generate_offline`, which ``omnistage verify`` holds
against transformers. Thinker: :func:`build_thinker_request`,
:func:`multimodal_hidden`. Talker: :func:`build_talker_request` once the first
thinker token exists, then its :class:`TalkerTextFeed`. Code2wav:
:class:`FrameChunker`, :class:`TalkerCodecStream`.

transformers' quirks followed: ``n`` talker steps give ``n - 1`` frames (the last
code 0, EOS or not, never gets residual codes); the talker's M-RoPE layout uses
the talker config's ids over ``talker_input_ids``; audio is ``chunked_decode(300, 25)``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import NamedTuple, Protocol

import torch
from torch import nn

from omnistage.engine import EngineConfig, Request, RequestOutput, SamplingParams
from omnistage.engine.generation_engine import ChunkJob, ChunkOutput, GenerationEngineCore
from omnistage.models.qwen3_omni.code2wav import Code2Wav, load_code2wav
from omnistage.models.qwen3_omni.code2wav_stream import StreamingCode2Wav
from omnistage.models.qwen3_omni.mm_spans import multimodal_spans
from omnistage.models.qwen3_omni.mrope import MRopeTokens, mrope_positions
from omnistage.models.qwen3_omni.prompt_media import PromptMedia
from omnistage.models.qwen3_omni.talker import Talker
from omnistage.models.qwen3_omni.thinker import Thinker
from omnistage.models.qwen3_omni.weights import Checkpoint
from omnistage.pipeline.sharded_stage import load_thinker
from omnistage.pipeline.transforms.qwen3_omni import (TalkerProjections, TalkerTokenIds, TrailingText,
                                                      build_talker_prompt)
from omnistage.processing.prompt import MultimodalInputs, ProcessedPrompt
from omnistage.runner import GenerationRunner, TalkerRequestData, TalkerStepHook, build_ar_engine
from omnistage.runner.talker_hook import talker_suppress_mask
from omnistage.runner.thinker_hook import ThinkerRequestData, ThinkerStepHook
from omnistage.runner.tp_executor import TPExecutor

# Settings ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ChunkPlan:
    """How talker frames become code2wav chunks; defaults are transformers' ``chunked_decode(300, 25)``.

    A smaller ``first_chunk_frames`` starts audio sooner. ``seamless`` decodes each request as a stream
    (``StreamingCode2Wav``: its transformer window and last outputs kept between chunks): no 555-sample hole at
    each boundary, and the joined chunks equal one whole decode whatever the chunk sizes.
    """

    chunk_frames: int = 300
    left_context: int = 25
    first_chunk_frames: int | None = None
    seamless: bool = False

    def __post_init__(self) -> None:
        if self.chunk_frames < 1 or self.left_context < 0 or (self.first_chunk_frames is not None
                                                               and self.first_chunk_frames < 1):
            raise ValueError(f"chunk sizes must be positive and left_context >= 0: {self}")

    def size(self, chunk_index: int, pending: int = 0) -> int:
        """Frames in chunk ``chunk_index`` (fixed: ``pending`` is for sizers that follow a player)."""
        first = self.first_chunk_frames or self.chunk_frames
        return first if chunk_index == 0 else self.chunk_frames


class ChunkSizer(Protocol):
    """Frames the chunk ``chunk_index`` takes, asked each time frames arrive (``pending`` are waiting)."""

    def size(self, chunk_index: int, pending: int) -> int: ...


@dataclass(frozen=True)
class GenerationSettings:
    """One request's settings for all three stages; defaults are verify's greedy run. min_new_tokens: transformers
    cannot build a talker prompt from a reply that is only EOS. Talker temperature 0 is transformers'
    ``talker_do_sample=False`` (the code predictor greedy too)."""

    max_new_tokens: int = 12
    min_new_tokens: int = 2
    talker_max_new_tokens: int = 24
    talker_min_new_tokens: int = 16
    talker_temperature: float = 0.0
    talker_top_k: int = 50
    talker_top_p: float = 1.0
    talker_repetition_penalty: float = 1.05
    talker_seed: int | None = None
    speaker: str = "ethan"
    chunks: ChunkPlan = field(default_factory=ChunkPlan)

    def thinker_params(self) -> SamplingParams:
        return SamplingParams(temperature=0.0, max_tokens=self.max_new_tokens, min_tokens=self.min_new_tokens)

    def talker_params(self) -> SamplingParams:
        return SamplingParams(
            temperature=self.talker_temperature, top_k=self.talker_top_k, top_p=self.talker_top_p,
            repetition_penalty=self.talker_repetition_penalty, seed=self.talker_seed,
            max_tokens=self.talker_max_new_tokens, min_tokens=self.talker_min_new_tokens,
        )


# Thinker ----------------------------------------------------------------------------------------


def _has_media(mm: MultimodalInputs) -> bool:
    return any(x is not None for x in (mm.input_features, mm.pixel_values, mm.pixel_values_videos))


def multimodal_rows(prompt_ids: list[int], multimodal: frozenset[int]) -> list[int]:
    return [i for i, tok in enumerate(prompt_ids) if tok in multimodal]


def build_thinker_request(
    thinker: Thinker, request_id: str, prompt: ProcessedPrompt, params: SamplingParams, eos_token_id: int | None,
    *, for_talker: bool = False,
) -> Request:
    """The thinker engine's request (run with :class:`ThinkerStepHook`). ``for_talker`` captures the accept-layer
    states the talker reads at multimodal rows. Prompts with media go in as embeddings keyed by their items'
    content (``multimodal_spans``), so they share prefix-cache blocks like token prompts do. Their encoders run
    when a step first computes an item's rows (:class:`PromptMedia`), never for items the prefix cache serves."""
    device = next(thinker.parameters()).device
    ids = torch.tensor(prompt.token_ids, dtype=torch.long)
    positions, delta = thinker.positions(ids, prompt.mm)
    multimodal = frozenset(getattr(thinker.config, f"{kind}_token_id") for kind in ("audio", "image", "video"))
    capture = for_talker and bool(multimodal_rows(prompt.token_ids, multimodal))
    media = PromptMedia.build(thinker, ids.to(device), prompt.mm) if _has_media(prompt.mm) else None
    embeds = media.embeds if media else (thinker.embed(ids.to(device)).inputs_embeds if capture else None)
    data = ThinkerRequestData(media=media, capture_hidden=capture)
    return Request(request_id, prompt.token_ids, params, prompt_embeds=embeds,
                   prompt_positions=positions, rope_delta=delta, eos_token_id=eos_token_id, stage_data=data,
                   mm_spans=multimodal_spans(prompt.token_ids, prompt.mm, thinker.mrope_tokens))


def multimodal_hidden(request: Request, multimodal: frozenset[int]) -> torch.Tensor | None:
    """Accept-layer states ``[M, H]`` at the prompt's multimodal rows, once prefilled (None: no such rows)."""
    rows = multimodal_rows(request.prompt_token_ids, multimodal)
    if not rows:
        return None
    data = request.stage_data
    if not isinstance(data, ThinkerRequestData) or data.num_captured < request.num_prompt_tokens:
        raise RuntimeError(f"{request.request_id}: prompt hidden states not captured (for_talker=True, prefilled?)")
    return data.hidden_states()[rows]


# Talker -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PromptLayout:
    """The thinker prompt as the talker needs it: ids plus the shapes that lay out M-RoPE (no pixels)."""

    token_ids: list[int]
    image_grid_thw: torch.Tensor | None = None
    video_grid_thw: torch.Tensor | None = None
    audio_lengths: torch.Tensor | None = None
    video_second_per_grid: torch.Tensor | None = None

    @classmethod
    def from_prompt(cls, prompt: ProcessedPrompt) -> PromptLayout:
        mm = prompt.mm
        return cls(list(prompt.token_ids), mm.image_grid_thw, mm.video_grid_thw, mm.audio_lengths(),
                   mm.video_second_per_grid)


def talker_mrope_tokens(talker_config: object, thinker_tokens: MRopeTokens) -> MRopeTokens:
    """transformers lays out the talker's positions with the talker config's ids; the audio window
    (absent from that config) is the thinker's. Equal to the thinker's tokens in sane checkpoints."""
    names = ("image_token_id", "video_token_id", "audio_token_id", "vision_start_token_id",
             "audio_start_token_id", "spatial_merge_size", "position_id_per_seconds")
    return replace(thinker_tokens, **{n: getattr(talker_config, n) for n in names if hasattr(talker_config, n)})


@dataclass(frozen=True)
class TalkerContext:
    """Everything the talker stage holds besides requests (the thinker's embedding table included:
    text rows are projected from it, so only multimodal hidden states cross from the thinker)."""

    talker: Talker
    thinker_embed: Callable[[torch.Tensor], torch.Tensor]
    token_ids: TalkerTokenIds
    mrope: MRopeTokens

    @property
    def codec_eos(self) -> int:
        return int(self.talker.config.codec_eos_token_id)

    def projections(self) -> TalkerProjections:
        t = self.talker
        return TalkerProjections(self.thinker_embed, t.text_projection, t.hidden_projection, t.embed_tokens)

    def step_hook(self) -> TalkerStepHook:
        mask = talker_suppress_mask(self.talker.config.text_config.vocab_size, self.codec_eos)
        return TalkerStepHook(self.talker, mask)


class TalkerTextFeed:
    """Moves the thinker's tokens into a talker request's trailing text as they arrive: :class:`TrailingText`
    decides each row (row j = token j + 1, final once token j + 2 exists; tts_eos after the last)."""

    def __init__(self, trailing: TrailingText, data: TalkerRequestData) -> None:
        self._trailing, self._data = trailing, data
        self._num_tokens = 0

    def extend(self, tokens: Iterable[int]) -> None:
        tokens = list(tokens)
        self._num_tokens += len(tokens)
        self._trailing.extend(tokens)
        self._sync(decided=max(self._num_tokens - 2, 0))

    def finish(self) -> None:
        """The thinker is done: the rest of its text, tts_eos, then tts_pad for ever."""
        self._trailing.finish()
        self._sync(decided=max(self._num_tokens - 2, 0) + 1)
        self._data.finish_text()

    def _sync(self, decided: int) -> None:
        start = len(self._data.trailing_text)
        if decided > start:
            rows = [self._trailing.row(j) for j in range(start, decided)]
            self._data.add_text(torch.stack(rows))


@torch.no_grad()
def build_talker_request(
    ctx: TalkerContext, request_id: str, layout: PromptLayout, mm_hidden: torch.Tensor | None, first_token: int,
    params: SamplingParams, speaker: str,
) -> tuple[Request, TalkerTextFeed]:
    """The talker engine's request once the thinker's first token exists, and its text feed
    (already given ``first_token``; pass it the later tokens, then ``finish()``)."""
    proj = ctx.projections()
    weight = ctx.talker.codec_head.weight
    hidden = torch.empty(0, ctx.talker.config.thinker_hidden_size) if mm_hidden is None else mm_hidden
    prompt = build_talker_prompt(layout.token_ids, hidden.to(weight.device, weight.dtype), first_token,
                                 ctx.token_ids.speaker_id(speaker), ctx.token_ids, proj)
    positions, delta = mrope_positions(prompt.input_ids, ctx.mrope, layout.image_grid_thw, layout.video_grid_thw,
                                       layout.audio_lengths, layout.video_second_per_grid)
    data = TalkerRequestData(tts_pad_embed=prompt.tts_pad_embed)
    feed = TalkerTextFeed(TrailingText(prompt, proj), data)
    feed.extend([first_token])
    request = Request(request_id, None, params, prompt_embeds=prompt.embeds, prompt_positions=positions,
                      rope_delta=delta, eos_token_id=ctx.codec_eos, stage_data=data)
    return request, feed


# Code2Wav ---------------------------------------------------------------------------------------


class FrameChunker:
    """Talker frames in (``[n, G]``, any pace), code2wav jobs out. A chunk is cut once a frame past its end
    exists, so the final chunk is always the one :meth:`finish` emits, marked ``is_last``. Sizes come from
    ``sizer`` (e.g. a player-aware planner), else from the plan; the left context from the plan."""

    def __init__(self, request_id: str, plan: ChunkPlan, num_groups: int, sizer: ChunkSizer | None = None) -> None:
        self.request_id, self.plan = request_id, plan
        self.sizer: ChunkSizer = sizer or plan
        self._buf = torch.empty(num_groups, 0, dtype=torch.long)  # [G, context + pending]
        self._context = 0
        self._index = 0

    @property
    def num_pending(self) -> int:
        return self._buf.shape[1] - self._context

    def push(self, frames: torch.Tensor) -> list[ChunkJob]:
        self._buf = torch.cat([self._buf, frames.to("cpu", torch.long).T], dim=1)
        jobs = []
        while self.num_pending > (size := self.sizer.size(self._index, self.num_pending)):
            jobs.append(self._emit(size, last=False))
        return jobs

    def finish(self) -> list[ChunkJob]:
        return [self._emit(self.num_pending, last=True)] if self.num_pending else []

    def _emit(self, num_new: int, last: bool) -> ChunkJob:
        end = self._context + num_new
        job = ChunkJob(self.request_id, self._index, self._buf[:, :end].clone(), self._context, is_last=last)
        keep = min(self.plan.left_context, end)
        self._buf, self._context = self._buf[:, end - keep:], keep
        self._index += 1
        return job


def talker_frames(output: RequestOutput) -> torch.Tensor | None:
    """The frames of one talker output that become audio: a finished request's final frame is
    dropped (its code 0 is EOS, or transformers stopped at max tokens without residual codes)."""
    frames = output.new_frames
    return frames[:-1] if frames is not None and output.finished else frames


class TalkerCodecStream:
    """Talker engine outputs of one request in, code2wav jobs out."""

    def __init__(self, chunker: FrameChunker) -> None:
        self.chunker = chunker

    def add(self, output: RequestOutput) -> list[ChunkJob]:
        frames = talker_frames(output)
        jobs = self.chunker.push(frames) if frames is not None and len(frames) else []
        return jobs + self.chunker.finish() if output.finished else jobs


def code2wav_runner(model: Code2Wav, plan: ChunkPlan, device: torch.device | str = "cpu") -> GenerationRunner:
    """Seamless: each stream decoded with its state kept between chunks (joined chunks equal the whole decode,
    whatever their sizes). Otherwise transformers' ``chunked_decode``: each chunk alone with its left context."""
    return GenerationRunner(StreamingCode2Wav(model) if plan.seamless else model, device)


def join_chunks(outputs: Iterable[ChunkOutput]) -> torch.Tensor:
    """One request's chunk outputs -> its waveform, in chunk order."""
    wavs = [o.wav for o in sorted(outputs, key=lambda o: o.chunk_index)]
    return torch.cat(wavs) if wavs else torch.zeros(0)


# Offline ----------------------------------------------------------------------------------------


def load_thinker_embedding(folder: str | Path, device: torch.device | str, dtype: torch.dtype) -> nn.Embedding:
    """The thinker's token embedding table alone (for a talker process that holds no thinker)."""
    names = ("thinker.model.language_model.embed_tokens.weight", "thinker.model.embed_tokens.weight")
    with Checkpoint(folder) as ckpt:
        name = next((n for n in names if ckpt.has(n)), None)
        if name is None:
            raise KeyError(f"{folder} holds no thinker embedding table ({' or '.join(names)})")
        weight = ckpt.get(name)
    return nn.Embedding.from_pretrained(weight.to(device, dtype), freeze=True)


@dataclass
class StageModels:
    """The three stage models of one checkpoint folder, on one device in one dtype (the thinker possibly as rank 0
    of a tensor-parallel group: ``close()`` stops its other ranks)."""

    thinker: Thinker
    talker: Talker
    code2wav: Code2Wav
    config: dict[str, object]  # config.json
    device: torch.device
    dtype: torch.dtype
    thinker_tp: TPExecutor | None = None

    @classmethod
    def load(cls, folder: str | Path, device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32,
             tensor_parallel_size: int = 1) -> StageModels:
        config = json.loads((Path(folder) / "config.json").read_text())
        thinker, tp = load_thinker(folder, device, dtype, tensor_parallel_size)
        return cls(thinker, Talker.from_checkpoint(folder, device, dtype), load_code2wav(folder, device, dtype), config,
                   torch.device(device), dtype, tp)

    def close(self) -> None:
        if self.thinker_tp is not None:
            self.thinker_tp.close()

    @property
    def eos_token_id(self) -> int:
        return int(self.config["im_end_token_id"])

    def talker_context(self) -> TalkerContext:
        mrope = talker_mrope_tokens(self.talker.config, self.thinker.mrope_tokens)
        return TalkerContext(self.talker, self.thinker.embed_tokens, TalkerTokenIds.from_config(self.config), mrope)

    def engine_config(self, max_len: int) -> EngineConfig:
        """One request of up to ``max_len`` tokens: eager (nothing to amortise a graph capture over)."""
        block = 16
        return EngineConfig(block_size=block, num_blocks=-(-max_len // block) + 2, max_num_seqs=1,
                            max_num_batched_tokens=max(max_len, 1), max_model_len=max_len, device=str(self.device),
                            dtype=self.dtype, enforce_eager=True)


class OfflineOutput(NamedTuple):
    tokens: list[int]  # generated thinker ids
    codes: torch.Tensor  # [G, frames]
    wav: torch.Tensor  # [samples] at 24 kHz


def generate_offline(models: StageModels, prompt: ProcessedPrompt, settings: GenerationSettings) -> OfflineOutput:
    """Thinker engine to completion, then the talker engine, then code2wav: one request, in order."""
    ctx = models.talker_context()
    thinker_req = build_thinker_request(models.thinker, "offline", prompt, settings.thinker_params(),
                                        models.eos_token_id, for_talker=True)
    engine = build_ar_engine(models.thinker, models.engine_config(len(prompt.token_ids) + settings.max_new_tokens),
                             ThinkerStepHook(), tp=models.thinker_tp)
    engine.add_request(thinker_req)
    engine.run_until_done()
    tokens = list(thinker_req.output_token_ids)
    talker_req, feed = build_talker_request(
        ctx, "offline", PromptLayout.from_prompt(prompt), multimodal_hidden(thinker_req, ctx.token_ids.multimodal),
        tokens[0], settings.talker_params(), settings.speaker)
    feed.extend(tokens[1:])
    feed.finish()
    engine = build_ar_engine(models.talker, models.engine_config(
        talker_req.num_prompt_tokens + settings.talker_max_new_tokens), ctx.step_hook())
    engine.add_request(talker_req)
    outputs = engine.run_until_done()
    return OfflineOutput(tokens, *_vocode(models, outputs, settings.chunks))


def _vocode(models: StageModels, outputs: list[RequestOutput], plan: ChunkPlan) -> tuple[torch.Tensor, torch.Tensor]:
    groups = models.talker.num_code_groups
    stream = TalkerCodecStream(FrameChunker("offline", plan, groups))
    vocoder = GenerationEngineCore(code2wav_runner(models.code2wav, plan, models.device))
    frames = [f for f in map(talker_frames, outputs) if f is not None]
    for output in outputs:
        for job in stream.add(output):
            vocoder.add_job(job)
    codes = torch.cat(frames).T.cpu() if frames else torch.zeros(groups, 0, dtype=torch.long)
    return codes, join_chunks(vocoder.run_until_done())
