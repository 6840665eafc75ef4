"""The engine's token log-probabilities in OpenAI's ``logprobs.content`` shape (token text and its UTF-8 bytes)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from omnistage.engine.logprobs import TokenLogprob
from omnistage.entrypoints.openai.chat.protocol import ChoiceLogprobs, TokenLogprobInfo, TopLogprob


class LogprobWriter:
    """``top``: how many alternatives the request asked for (``top_logprobs``)."""

    def __init__(self, tokenizer: Any, top: int) -> None:  # noqa: ANN401 - a transformers tokenizer
        self.tokenizer = tokenizer
        self.top = top

    def _text(self, token_id: int) -> str:
        if self.tokenizer is None:
            return f"token_id:{token_id}"
        return self.tokenizer.decode([token_id], skip_special_tokens=False)

    def _entry(self, token_id: int, logprob: float) -> TopLogprob:
        text = self._text(token_id)
        return TopLogprob(token=text, logprob=logprob, bytes=list(text.encode("utf-8")))

    def content(self, logprobs: Sequence[TokenLogprob]) -> list[TokenLogprobInfo]:
        out = []
        for lp in logprobs:
            head = self._entry(lp.token_id, lp.logprob)
            top = [self._entry(t, v) for t, v in lp.top[:self.top]]
            out.append(TokenLogprobInfo(token=head.token, logprob=head.logprob, bytes=head.bytes, top_logprobs=top))
        return out

    def choice(self, logprobs: Sequence[TokenLogprob]) -> ChoiceLogprobs:
        return ChoiceLogprobs(content=self.content(logprobs))
