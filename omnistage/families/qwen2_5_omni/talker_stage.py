"""The talker engine's request for one Qwen2.5-Omni reply, and the feed of the thinker's reply into it.

transformers' ``Qwen2_5OmniForConditionalGeneration.generate``, row by row (all rows in the thinker's width,
projected inside the talker): prompt row i is the thinker's last-layer (normed) hidden state at i plus its
token embedding (zero at media placeholders); then the speaker's text-bos embedding plus codec pad, then
``reply(gen 0)`` plus codec bos, where ``reply(gen m)`` = hidden state + embedding of the thinker's m-th
generated token fed back as input. Positions: TMRoPE (talker config's ids) over the prompt ids, the text-bos id
and gen 0. Generated code j is fed with ``reply(gen j + 1)`` while the thinker's fed tokens last, then the
text-eos embedding once, then text-pad for ever. The codec bos is never sampled; codec pad and eos both stop.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import msgspec
import torch

from omnistage.engine import Request
from omnistage.models.qwen2_5_omni.inputs import OmniInputs
from omnistage.models.qwen2_5_omni.talker import Talker
from omnistage.models.qwen2_5_omni.tmrope import tmrope_positions
from omnistage.runner.talker_hook import TalkerRequestData, TalkerStepHook, talker_data
from omnistage.sampling_params import SamplingParams


@dataclass(frozen=True)
class TalkerContext:
    """What the talker stage holds besides requests: the talker, the thinker's embedding table and media ids."""

    talker: Talker
    thinker_embed: Callable[[torch.Tensor], torch.Tensor]
    media_tokens: tuple[int, ...]

    @property
    def stop_codes(self) -> tuple[int, int]:
        """transformers' ``talker_eos_token_id`` default ``[8292, 8294]``: codec pad and codec eos."""
        c = self.talker.config
        return int(c.tts_codec_pad_token_id), int(c.tts_codec_end_token_id)

    def step_hook(self) -> TalkerStepHook:
        """The generic talker hook at one codebook; only codec bos is suppressed (``suppress_tokens``)."""
        mask = torch.zeros(self.talker.config.vocab_size, dtype=torch.bool)
        mask[int(self.talker.config.tts_codec_start_token_id)] = True
        return TalkerStepHook(self.talker, mask)

    def text_row(self, token_id: int) -> torch.Tensor:
        w = self.talker.codec_head.weight
        return self.thinker_embed(torch.tensor([token_id], device=w.device))[0].to(w.dtype)

    def reply_rows(self, token_ids: list[int], hidden: torch.Tensor) -> torch.Tensor:
        """``reply(gen m)`` rows ``[k, E]``: hidden states plus token embeddings of the fed tokens."""
        w = self.talker.codec_head.weight
        ids = torch.tensor(token_ids, dtype=torch.long, device=w.device)
        return hidden.to(w.device, w.dtype) + self.thinker_embed(ids).to(w.dtype)


def talker_params(params: SamplingParams, stop_codes: tuple[int, ...]) -> SamplingParams:
    return msgspec.structs.replace(params, stop_token_ids=tuple(dict.fromkeys([*params.stop_token_ids, *stop_codes])))


@torch.no_grad()
def build_talker_request(ctx: TalkerContext, request_id: str, prompt_ids: list[int], mm: OmniInputs,
                         prompt_hidden: torch.Tensor, speaker_bos: int, first_token: int,
                         first_hidden: torch.Tensor, params: SamplingParams) -> Request:
    """The talker's request once the thinker's gen 0 has been fed (``first_hidden`` ``[E]`` its state); later
    reply rows go in through :func:`feed_reply`, the end through :func:`finish_reply`."""
    talker, cfg = ctx.talker, ctx.talker.config
    w = talker.codec_head.weight
    ids = torch.tensor(prompt_ids, dtype=torch.long, device=w.device)
    embeds = ctx.thinker_embed(ids).to(w.dtype)
    media = torch.isin(ids, torch.tensor(ctx.media_tokens, device=w.device))
    embeds = embeds.masked_fill(media[:, None], 0.0)
    first = ctx.reply_rows([first_token], first_hidden.view(1, -1))
    rows = torch.cat([prompt_hidden.to(w.device, w.dtype) + embeds, ctx.text_row(speaker_bos)[None], first])
    pad, bos, mask = cfg.tts_codec_pad_token_id, cfg.tts_codec_start_token_id, cfg.tts_codec_mask_token_id
    rows[-2:] += talker.embed_tokens(torch.tensor([pad, bos], device=w.device))
    text_ids = torch.tensor([*prompt_ids, speaker_bos, first_token], dtype=torch.long)
    positions, delta = tmrope_positions(text_ids, talker.rope_tokens, mm.grids(), mm.use_audio_in_video)
    data = TalkerRequestData(tts_pad_embed=ctx.text_row(int(cfg.tts_text_pad_token_id)))
    codes = [int(mask)] * len(prompt_ids) + [int(pad), int(bos)]  # what the repetition penalty counts
    return Request(request_id, codes, talker_params(params, ctx.stop_codes), prompt_embeds=rows,
                   prompt_positions=positions, rope_delta=delta, eos_token_id=ctx.stop_codes[1], stage_data=data)


def feed_reply(ctx: TalkerContext, request: Request, token_ids: list[int], hidden: torch.Tensor) -> None:
    """More fed thinker tokens (gen 1, 2, ...) with their hidden states ``[k, E]``."""
    if token_ids:
        talker_data(request).add_text(ctx.reply_rows(token_ids, hidden))


def finish_reply(ctx: TalkerContext, request: Request) -> None:
    """The thinker is done: the text-eos row, then text-pad for ever."""
    data = talker_data(request)
    data.add_text(ctx.text_row(int(ctx.talker.config.tts_text_end_token_id))[None])
    data.finish_text()


def audio_codes(codes: list[int], stop_codes: tuple[int, ...]) -> list[int]:
    """The codes token2wav decodes: up to the first stop code (transformers' ``talker_code_lengths``)."""
    for i, code in enumerate(codes):
        if code in stop_codes:
            return codes[:i]
    return codes

