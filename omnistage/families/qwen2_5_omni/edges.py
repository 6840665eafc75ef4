"""Qwen2.5-Omni's per-request edges: thinker → talker (reply rows as they exist) and talker → token2wav (the
whole reply's codes at once).

Row ``P + m`` (``P`` prompt rows) is the state of reply token m fed back to the thinker, so it exists only once
token m + 1 was sampled: the talker starts when the first reply token's row has arrived (its start needs it), and
gets token m with its row when that row arrives; the last token is never fed (transformers feeds tokens
``1 .. n - 2``). A reply of fewer than 2 tokens gets no audio. When the thinker is done the talker reads text-eos,
then text-pad.
"""

from __future__ import annotations

import torch

from omnistage.families.base import EdgeContext, RequestEdge
from omnistage.families.qwen2_5_omni.payloads import ReplyFeed, ReplyHidden, TalkerStart, Token2WavJob
from omnistage.families.qwen2_5_omni.prompt import Qwen25OmniPrompt
from omnistage.families.qwen2_5_omni.voices import DEFAULT_VOICE
from omnistage.families.sampling import stage_params
from omnistage.ipc.payloads import CodecFrames, TokenDelta
from omnistage.models.qwen2_5_omni.inputs import OmniInputs


def _prompt(context: EdgeContext) -> Qwen25OmniPrompt:
    prompt = context.request.prompt
    if not isinstance(prompt, Qwen25OmniPrompt):
        raise TypeError(f"a Qwen2.5-Omni request carries a Qwen25OmniPrompt, not {type(prompt).__name__}")
    return prompt


def layout(mm: OmniInputs) -> OmniInputs:
    """What the talker's positions need of the encoder inputs: their grids, not the features or pixels."""
    return OmniInputs(feature_attention_mask=mm.feature_attention_mask, image_grid_thw=mm.image_grid_thw,
                      video_grid_thw=mm.video_grid_thw, video_second_per_grid=mm.video_second_per_grid,
                      use_audio_in_video=mm.use_audio_in_video)


class ThinkerToTalker(RequestEdge):
    def __init__(self, context: EdgeContext) -> None:
        self.context = context
        self.prompt = _prompt(context)
        self.rows: list[torch.Tensor] = []  # rows base, base + 1, ... not yet sent
        self.base = 0
        self.num_rows = 0
        self.tokens: list[int] = []
        self.fed = 0  # reply tokens the talker has (0, 1 .. fed - 1)
        self.done = False

    def on_output(self, payload: object, finished: bool) -> list[object]:
        if self.done:
            return []
        if isinstance(payload, ReplyHidden):
            self.rows.append(payload.rows)
            self.num_rows += payload.rows.shape[0]
        elif isinstance(payload, TokenDelta):
            self.tokens += payload.token_ids
        out: list[object] = []
        p = len(self.prompt.token_ids)
        if not self.fed and len(self.tokens) >= 2 and self.num_rows > p:
            out.append(self._start(p))
        if self.fed:
            ready = min(len(self.tokens), self.num_rows - p)
            if ready > self.fed or finished:
                out.append(ReplyFeed(self.tokens[self.fed:ready], self._hidden(p + self.fed, p + ready), finished))
                self.fed = max(ready, self.fed)
        self.done = finished
        return out

    def _hidden(self, start: int, end: int) -> torch.Tensor | None:
        """Rows ``start .. end`` (each asked for once, in order); those before ``end`` are let go."""
        if end <= start:
            return None
        pending = torch.cat(self.rows) if len(self.rows) > 1 else self.rows[0]
        self.rows, out = [pending[end - self.base:]], pending[start - self.base:end - self.base]
        self.base = end
        return out

    def _start(self, p: int) -> TalkerStart:
        self.fed = 1
        request = self.context.request
        hidden = self._hidden(0, p + 1)
        assert hidden is not None
        sampling = stage_params(self.context.target.sampling, request.sampling.seed, self.context.min_new_tokens)
        return TalkerStart(list(self.prompt.token_ids), layout(self.prompt.mm), hidden[:p], self.tokens[0], hidden[p],
                           request.voice or DEFAULT_VOICE, sampling)


class TalkerToToken2Wav(RequestEdge):
    """Gathers the talker's codes; sends one whole-utterance job when the talker is done (none without codes)."""

    def __init__(self, context: EdgeContext) -> None:
        self.context = context
        self.codes: list[torch.Tensor] = []

    def on_output(self, payload: object, finished: bool) -> list[Token2WavJob]:
        if isinstance(payload, CodecFrames) and payload.frames.numel():
            self.codes.append(payload.frames[:, 0].to("cpu", torch.long))
        if not finished or not self.codes:
            return []
        request = self.context.request
        codes, self.codes = torch.cat(self.codes), []
        return [Token2WavJob(codes, request.voice or DEFAULT_VOICE, request.sampling.seed or 0)]
