"""Which thinker tokens a request's talker speaks: all of them, less the spans its front end marked unspoken (every
family whose talker reads the thinker's text: Qwen3-Omni, Qwen2.5-Omni)."""

from __future__ import annotations

from collections.abc import Sequence

from omnistage.core import UnspokenSpan


class SpokenTokens:
    """Filters one request's thinker tokens as they stream (the state carries across messages)."""

    def __init__(self, span: UnspokenSpan | None) -> None:
        self.span = span
        self.inside = span is not None and span.open_at_start

    def take(self, token_ids: Sequence[int]) -> list[int]:
        span = self.span
        if span is None:
            return list(token_ids)
        spoken: list[int] = []
        for token in token_ids:
            if self.inside:
                self.inside = token != span.close_id
            elif token == span.open_id:
                self.inside = True
            else:
                spoken.append(token)
        return spoken
