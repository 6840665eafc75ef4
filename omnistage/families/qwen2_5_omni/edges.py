"""Qwen2.5-Omni's per-request edge thinker → talker (reply rows as they exist); talker → token2wav is the generic
codec edge.

Row ``P + m`` (``P`` prompt rows) is the state of reply token m fed back to the thinker, so it exists only once
token m + 1 was sampled: the talker starts when the first reply token's row has arrived (its start needs it), and
gets token m with its row when that row arrives; the last token is never fed (transformers feeds tokens
``1 .. n - 2``). A reply of fewer than 2 tokens gets no audio. Tokens the front end marked unspoken (tool
calls) are skipped with their rows. When the thinker is done the talker reads text-eos,
then text-pad.
"""

from __future__ import annotations

import torch

from omnistage.families.base import EdgeContext, RequestEdge
from omnistage.families.qwen2_5_omni.payloads import ReplyFeed, ReplyHidden, TalkerStart
from omnistage.families.qwen2_5_omni.prompt import Qwen25OmniPrompt
from omnistage.families.qwen2_5_omni.voices import DEFAULT_VOICE
from omnistage.families.spoken import SpokenTokens
from omnistage.ipc.payloads import TokenDelta
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
    """Reply token m goes to the talker with row ``P + m`` once that row exists, unless the front end marked it
    unspoken (a tool call: :class:`SpokenTokens`); the talker starts on the first spoken token."""

    def __init__(self, context: EdgeContext) -> None:
        self.context = context
        self.prompt = _prompt(context)
        self.spoken = SpokenTokens(context.request.unspoken)  # tool calls are never spoken
        self.rows: list[torch.Tensor] = []  # rows base, base + 1, ... not yet sent or let go
        self.base = 0
        self.num_rows = 0
        self.tokens: list[int] = []
        self.spoken_at: list[int] = []  # reply indices of the spoken tokens
        self.fed = 0  # spoken tokens the talker has
        self.done = False

    def on_output(self, payload: object, finished: bool) -> list[object]:
        if self.done:
            return []
        if isinstance(payload, ReplyHidden):
            self.rows.append(payload.rows)
            self.num_rows += payload.rows.shape[0]
        elif isinstance(payload, TokenDelta):
            for token in payload.token_ids:
                if self.spoken.take((token,)):
                    self.spoken_at.append(len(self.tokens))
                self.tokens.append(token)
        p = len(self.prompt.token_ids)
        ready = min(len(self.tokens), self.num_rows - p)  # tokens whose rows exist
        todo = [m for m in self.spoken_at[self.fed:] if m < ready]
        out: list[object] = []
        if not self.fed and todo and len(self.tokens) > todo[0] + 1:  # as the thinker sends them: row, then token
            out.append(self._start(p, todo[0]))
            todo = todo[1:]
        if self.fed and (todo or finished):
            hidden = self._take([p + m for m in todo]) if todo else None
            out.append(ReplyFeed([self.tokens[m] for m in todo], hidden, finished))
            self.fed += len(todo)
        self.done = finished
        return out

    def _take(self, rows: list[int]) -> torch.Tensor:
        """Rows ``rows`` (ascending, each asked for once); every row up to the last is let go."""
        pending = torch.cat(self.rows) if len(self.rows) > 1 else self.rows[0]
        out = pending[torch.tensor(rows) - self.base]
        self.rows, self.base = [pending[rows[-1] + 1 - self.base:]], rows[-1] + 1
        return out

    def _start(self, p: int, first: int) -> TalkerStart:
        self.fed = 1
        request = self.context.request
        hidden = self._take([*range(p), p + first])
        sampling = self.context.stage_sampling()
        return TalkerStart(list(self.prompt.token_ids), layout(self.prompt.mm), hidden[:p], self.tokens[first],
                           hidden[p], request.voice or DEFAULT_VOICE, sampling)
