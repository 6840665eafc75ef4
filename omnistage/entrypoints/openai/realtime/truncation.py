"""Conversation truncation, as OpenAI's Realtime API does it: a long session drops its oldest items, never fails.

The session's ``truncation``: ``"auto"`` (the default) drops the oldest items
once the rendered prompt would leave less than the response's budget in the
model's context, just enough to fit; ``{"type": "retention_ratio",
"retention_ratio": r}`` then drops down to ``r`` of the room after the
instructions, so the next turns grow without dropping again (the prefix cache
keeps hitting until then); its ``token_limits.post_instructions`` lowers that
room. ``"disabled"`` keeps every item, and a prompt past the context is an
error. The instructions and tools are always kept; a dropped ``function_call``
takes the outputs after it along (a ``tool`` turn without its call reads as
nonsense to the model). The last item is never dropped.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from omnistage.processing.prompt import ProcessedPrompt

if TYPE_CHECKING:  # the session config (protocol.py) holds a Truncation; items.py imports protocol.py
    from omnistage.entrypoints.openai.realtime.items import Item

Render = Callable[[tuple["Item", ...]], Awaitable[ProcessedPrompt]]


@dataclass(frozen=True)
class Truncation:
    kind: str = "auto"  # "auto", "retention_ratio" or "disabled"
    retention_ratio: float = 1.0
    post_instructions: int | None = None  # token_limits.post_instructions: the room after the instructions

    def describe(self) -> str | dict[str, Any]:
        if self.kind != "retention_ratio":
            return self.kind
        limits = None if self.post_instructions is None else {"post_instructions": self.post_instructions}
        return {"type": "retention_ratio", "retention_ratio": self.retention_ratio, "token_limits": limits}


def parse_truncation(value: Any) -> Truncation:  # noqa: ANN401 - client JSON
    """``ValueError`` says what is wrong (the caller names the field)."""
    if value in ("auto", "disabled"):
        return Truncation(value)
    if not isinstance(value, dict) or value.get("type") != "retention_ratio":
        raise ValueError("must be 'auto', 'disabled' or {'type': 'retention_ratio', 'retention_ratio': 0..1}")
    ratio = value.get("retention_ratio")
    if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or not 0.0 <= ratio <= 1.0:
        raise ValueError("retention_ratio must be a number in [0, 1]")
    limits = value.get("token_limits") or {}
    limit = limits.get("post_instructions") if isinstance(limits, dict) else None
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise ValueError("token_limits.post_instructions must be a positive integer")
    return Truncation("retention_ratio", float(ratio), limit)


def _cuts(items: tuple[Item, ...]) -> list[int]:
    """Where the kept items may start: never at a function_call_output (its call would be gone); never past the
    last item."""
    return [i for i in range(1, len(items)) if items[i].type != "function_call_output"]


async def fit_prompt(items: tuple[Item, ...], render: Render, truncation: Truncation,
                     limit: int) -> tuple[ProcessedPrompt, int]:
    """The prompt of ``items`` and how many of the oldest were dropped to fit it in ``limit`` tokens (the context
    less the response's budget). Binary search over the cut points: a handful of renders, however long the
    session."""
    prompt = await render(items)
    if truncation.kind == "disabled" or not items:
        return prompt, 0
    instructions = None
    if truncation.post_instructions is not None:
        instructions = len((await render(())).token_ids)
        limit = min(limit, instructions + truncation.post_instructions)
    if len(prompt.token_ids) <= limit:
        return prompt, 0
    target = limit
    if truncation.kind == "retention_ratio":
        instructions = len((await render(())).token_ids) if instructions is None else instructions
        target = instructions + int(truncation.retention_ratio * max(0, limit - instructions))
    cuts = _cuts(items)
    low, high, best = 0, len(cuts) - 1, None
    while low <= high:  # the prompt shrinks as the cut moves later: the earliest cut that fits
        mid = (low + high) // 2
        candidate = await render(items[cuts[mid]:])
        if len(candidate.token_ids) <= target:
            best, high = (candidate, cuts[mid]), mid - 1
        else:
            low = mid + 1
    if best is None and cuts:  # even the last item alone is past the target: keep it if it fits the limit
        best = (await render(items[cuts[-1]:]), cuts[-1])
    return best if best is not None else (prompt, 0)
