"""Qwen3-Omni's thinker → talker edge, per request: the talker starts on the thinker's first token.

Async chunk streaming: the thinker's prompt hidden states (sent before its first tokens) and its first token
start the talker (:class:`TalkerStart`) while the thinker keeps generating; each later token reaches the talker
as a :class:`TextFeed`, and the thinker's end (its last token, or a stop string the orchestrator matched) ends
the feed.
"""

from __future__ import annotations

import torch

from omnistage.engine.request import MultimodalSpan
from omnistage.families.base import EdgeContext, RequestEdge
from omnistage.families.spoken import SpokenTokens
from omnistage.families.qwen3_omni.payloads import PromptHidden, TalkerStart, TextFeed
from omnistage.ipc.payloads import TokenDelta
from omnistage.models.qwen3_omni.inputs import PromptLayout
from omnistage.families.qwen3_omni.prompt import Qwen3OmniPrompt
from omnistage.families.qwen3_omni.voices import DEFAULT_VOICE


class ThinkerToTalker(RequestEdge):
    def __init__(self, context: EdgeContext) -> None:
        self.context = context
        self.hidden: torch.Tensor | None = None
        self.items: tuple[MultimodalSpan, ...] = ()  # the thinker's multimodal items: the talker's cache keys
        self.spoken = SpokenTokens(context.request.unspoken)  # tool calls are never spoken
        self.started = False
        self.done = False

    def on_output(self, payload: object, finished: bool) -> list[object]:
        if self.done:
            return []
        if isinstance(payload, PromptHidden):
            self.hidden, self.items = payload.mm_hidden, payload.items
            return []
        tokens = self.spoken.take(payload.token_ids) if isinstance(payload, TokenDelta) else []
        out: list[object] = []
        if not self.started:
            if not tokens:
                return []  # nothing to start the talker with yet (and if the thinker ended, no audio)
            out.append(self._start(tokens[0]))
            tokens = tokens[1:]
        if tokens or finished:
            out.append(TextFeed(tokens, finished))
        self.done = finished
        return out

    def _start(self, first_token: int) -> TalkerStart:
        self.started = True
        request = self.context.request
        prompt = request.prompt
        if not isinstance(prompt, Qwen3OmniPrompt):
            raise TypeError(f"a Qwen3-Omni request carries a Qwen3OmniPrompt, not {type(prompt).__name__}")
        sampling = self.context.stage_sampling()
        layout = PromptLayout.of(prompt.token_ids, prompt.mm)
        return TalkerStart(layout, first_token, request.voice or DEFAULT_VOICE, sampling, self.hidden, self.items)
