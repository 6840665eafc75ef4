"""One Qwen2.5-Omni reply through the thinker's and the talker's engines in turn (what verify and the parity
tests hold against transformers): the thinker run whole with its hidden states captured, then the talker fed
the whole reply."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from omnistage.engine import EngineConfig
from omnistage.families.qwen2_5_omni.talker_stage import (TalkerContext, audio_codes, build_talker_request,
                                                          feed_reply, finish_reply)
from omnistage.families.qwen2_5_omni.thinker_hook import HiddenCapture, ThinkerHiddenHook
from omnistage.families.qwen2_5_omni.thinker_stage import build_thinker_request
from omnistage.models.qwen2_5_omni.config import Qwen25OmniConfig
from omnistage.models.qwen2_5_omni.inputs import OmniInputs
from omnistage.models.qwen2_5_omni.talker import Talker
from omnistage.models.qwen2_5_omni.thinker import Thinker
from omnistage.runner import build_ar_engine
from omnistage.sampling_params import SamplingParams


@dataclass(frozen=True)
class SpokenReply:
    text_tokens: list[int]
    codes: list[int]  # every sampled code (the stop code last, if one was sampled)

    def audio_codes(self, stop_codes: tuple[int, ...]) -> list[int]:
        return audio_codes(self.codes, stop_codes)


def load_talker_context(folder: str | Path, thinker: Thinker, config: Qwen25OmniConfig) -> TalkerContext:
    device = next(thinker.parameters()).device
    talker = Talker.from_checkpoint(folder, device, next(thinker.parameters()).dtype, config=config)
    return TalkerContext(talker, thinker.embed_tokens, thinker.media_tokens)


def _engine(model: torch.nn.Module, length: int, hook: object) -> object:
    blocks = -(-length // 16) + 2
    return build_ar_engine(model, EngineConfig(block_size=16, num_blocks=blocks, max_num_seqs=1,
                                               max_num_batched_tokens=64, max_model_len=length,
                                               enforce_eager=True), hook)


@torch.inference_mode()
def generate_spoken(thinker: Thinker, ctx: TalkerContext, ids: list[int], mm: OmniInputs, speaker_bos: int,
                    thinker_params: SamplingParams, talker_params: SamplingParams,
                    eos_token_id: int | None) -> SpokenReply:
    request = build_thinker_request(thinker, "thinker", ids, mm, thinker_params, eos_token_id, capture=True)
    engine = _engine(thinker, len(ids) + thinker_params.max_tokens, ThinkerHiddenHook())
    engine.add_request(request)
    engine.run_until_done()
    tokens = list(request.output_token_ids)
    capture = request.stage_data
    assert isinstance(capture, HiddenCapture)
    hidden = capture.drain()
    if len(tokens) < 2 or hidden is None:
        return SpokenReply(tokens, [])
    p = len(ids)
    talker = build_talker_request(ctx, "talker", ids, mm, hidden[:p], speaker_bos, tokens[0], hidden[p],
                                  talker_params)
    feed_reply(ctx, talker, tokens[1:len(tokens) - 1], hidden[p + 1:p + len(tokens) - 1])
    finish_reply(ctx, talker)
    engine = _engine(ctx.talker, p + 2 + talker_params.max_tokens, ctx.step_hook())
    engine.add_request(talker)
    engine.run_until_done()
    return SpokenReply(tokens, list(talker.output_token_ids))
