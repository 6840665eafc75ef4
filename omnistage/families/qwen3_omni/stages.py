"""What one request needs inside Qwen3-Omni's stages: the thinker's and the talker's engine requests.

Shared by the streaming workers (a stage builds these from what crossed its
boundary) and by :func:`omnistage.families.qwen3_omni.offline.generate_offline`,
which ``omnistage verify`` holds against transformers. Thinker:
:func:`build_thinker_request`, :func:`multimodal_hidden`. Talker:
:func:`build_talker_request` once the first thinker token exists, then its
:class:`TalkerTextFeed`. Code2wav: :func:`code2wav_runner`.

transformers' quirks followed: ``n`` talker steps give ``n - 1`` frames (the last
code 0, EOS or not, never gets residual codes); the talker's M-RoPE layout uses
the talker config's ids over ``talker_input_ids``; audio is ``chunked_decode(300, 25)``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace

import torch

from omnistage.engine import Request
from omnistage.engine.request import MultimodalSpan
from omnistage.engine.frame_chunker import ChunkPlan
from omnistage.families.qwen3_omni.mm_spans import multimodal_spans
from omnistage.families.qwen3_omni.talker_cache_keys import talker_row_keys
from omnistage.families.qwen3_omni.thinker_hook import ThinkerRequestData
from omnistage.models.qwen3_omni.code2wav import Code2Wav
from omnistage.models.qwen3_omni.code2wav_stream import StreamingCode2Wav
from omnistage.models.qwen3_omni.config import TalkerTokenIds
from omnistage.models.qwen3_omni.inputs import MultimodalInputs, PromptLayout
from omnistage.models.qwen3_omni.mrope import MRopeTokens, mrope_positions
from omnistage.models.qwen3_omni.prompt_media import PromptMedia
from omnistage.models.qwen3_omni.talker import Talker
from omnistage.models.qwen3_omni.talker_prompt import TalkerProjections, TrailingText, build_talker_prompt
from omnistage.models.qwen3_omni.thinker import Thinker
from omnistage.runner import GenerationRunner, TalkerRequestData, TalkerStepHook
from omnistage.runner.talker_hook import talker_suppress_mask
from omnistage.sampling_params import SamplingParams


# Thinker ----------------------------------------------------------------------------------------


def multimodal_rows(prompt_ids: list[int], multimodal: frozenset[int]) -> list[int]:
    return [i for i, tok in enumerate(prompt_ids) if tok in multimodal]


def build_thinker_request(
    thinker: Thinker, request_id: str, token_ids: list[int], mm: MultimodalInputs, params: SamplingParams,
    eos_token_id: int | None, *, for_talker: bool = False,
) -> Request:
    """The thinker engine's request (run with :class:`ThinkerStepHook`). ``for_talker`` captures the accept-layer
    states the talker reads at multimodal rows. Prompts with media go in as embeddings keyed by their items'
    content (``multimodal_spans``), so they share prefix-cache blocks like token prompts do. Their encoders run
    when a step first computes an item's rows (:class:`PromptMedia`), never for items the prefix cache serves."""
    device = next(thinker.parameters()).device
    ids = torch.tensor(token_ids, dtype=torch.long)
    positions, delta = thinker.positions(ids, mm)
    multimodal = frozenset(getattr(thinker.config, f"{kind}_token_id") for kind in ("audio", "image", "video"))
    capture = for_talker and bool(multimodal_rows(token_ids, multimodal))
    media = PromptMedia.build(thinker, ids.to(device), mm) if mm.has_media else None
    embeds = media.embeds if media else (thinker.embed(ids.to(device)).inputs_embeds if capture else None)
    data = ThinkerRequestData(media=media, capture_hidden=capture)
    return Request(request_id, list(token_ids), params, prompt_embeds=embeds,
                   prompt_positions=positions, rope_delta=delta, eos_token_id=eos_token_id, stage_data=data,
                   mm_spans=multimodal_spans(token_ids, mm, thinker.mrope_tokens))


def multimodal_hidden(request: Request, multimodal: frozenset[int]) -> torch.Tensor | None:
    """Accept-layer states ``[M, H]`` at the prompt's multimodal rows, once prefilled (None: no such rows)."""
    rows = multimodal_rows(request.prompt_token_ids, multimodal)
    if not rows:
        return None
    data = request.stage_data
    if not isinstance(data, ThinkerRequestData) or data.hidden.num_captured < request.num_prompt_tokens:
        raise RuntimeError(f"{request.request_id}: prompt hidden states not captured (for_talker=True, prefilled?)")
    return data.hidden.all()[rows]


# Talker -----------------------------------------------------------------------------------------


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
    params: SamplingParams, speaker: str, thinker_items: Sequence[MultimodalSpan] = (),
) -> tuple[Request, TalkerTextFeed]:
    """The talker engine's request once the thinker's first token exists, and its text feed
    (already given ``first_token``; pass it the later tokens, then ``finish()``). ``thinker_items``: the
    thinker request's multimodal items, which key the talker's prefix cache (:func:`talker_row_keys`)."""
    proj = ctx.projections()
    weight = ctx.talker.codec_head.weight
    hidden = torch.empty(0, ctx.talker.config.thinker_hidden_size) if mm_hidden is None else mm_hidden
    speaker_id = ctx.token_ids.speaker_id(speaker)
    prompt = build_talker_prompt(layout.token_ids, hidden.to(weight.device, weight.dtype), first_token,
                                 speaker_id, ctx.token_ids, proj)
    positions, delta = mrope_positions(prompt.input_ids, ctx.mrope, layout.image_grid_thw, layout.video_grid_thw,
                                       layout.audio_lengths, layout.video_second_per_grid)
    keys = talker_row_keys(layout.token_ids, prompt.user_rows, len(prompt.embeds), thinker_items,
                           ctx.token_ids.multimodal, (first_token, speaker_id))
    data = TalkerRequestData(tts_pad_embed=prompt.tts_pad_embed)
    feed = TalkerTextFeed(TrailingText(prompt, proj), data)
    feed.extend([first_token])
    request = Request(request_id, None, params, prompt_embeds=prompt.embeds, prompt_positions=positions,
                      rope_delta=delta, eos_token_id=ctx.codec_eos, stage_data=data, mm_spans=keys)
    return request, feed


# Code2Wav ---------------------------------------------------------------------------------------


def code2wav_runner(model: Code2Wav, plan: ChunkPlan, device: torch.device | str = "cpu") -> GenerationRunner:
    """Seamless: each stream decoded with its state kept between chunks (joined chunks equal the whole decode,
    whatever their sizes). Otherwise transformers' ``chunked_decode``: each chunk alone with its left context."""
    return GenerationRunner(StreamingCode2Wav(model) if plan.seamless else model, device)

