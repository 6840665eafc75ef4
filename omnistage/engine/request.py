"""The scheduler's view of one request: its tokens, progress and status.

vLLM v1's single rule lives here: ``num_computed_tokens`` (tokens whose KV is in
the cache) catches up with ``num_tokens`` (prompt + generated). A prefill chunk,
a decode step and a recompute after preemption all just advance that counter.
"""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass

import torch

from omnistage.sampling_params import SamplingParams


class FinishReason(str, enum.Enum):
    """Why a request ended, in one stage's engine and for the caller alike (the one enum of both)."""

    STOP = "stop"  # EOS or a stop token/string
    LENGTH = "length"  # max_tokens reached
    ABORT = "abort"  # cancelled by the caller or a deadline
    ERROR = "error"  # a stage failed while holding the request (e.g. its logits were not finite)


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    PREEMPTED = "preempted"
    FINISHED = "finished"


@dataclass(frozen=True)
class MultimodalSpan:
    """Prompt positions ``[start, end)`` whose embeddings come from one multimodal item (an audio, an image, a
    video), and a digest of that item's content: what, besides the ids, a prefix-cache block over them depends on."""

    start: int
    end: int
    content_hash: bytes  # SHA-256 digest

    def __post_init__(self) -> None:
        if not 0 <= self.start < self.end or len(self.content_hash) != 32:
            raise ValueError(f"a multimodal span needs 0 <= start < end and a 32-byte digest: {self}")


class Request:
    """A generation request inside one stage's engine.

    The prompt is token ids, or embeddings ``prompt_embeds [L, H]`` (then
    ``prompt_token_ids`` is empty or the L ids fed alongside). ``prompt_positions``
    are the prompt's rotary positions (``[3, L]`` for M-RoPE, ``[L]`` otherwise;
    None = ``0..L-1``); generated token ``p`` sits at ``p + rope_delta``.
    ``stage_data`` is per-request state owned by a stage's step hook (the
    talker's trailing text), opaque to the engine. ``mm_spans`` says that the
    embeddings are the ids' own except over these items (the thinker's merged
    encoder features), so the prompt is identified by ids + item hashes and may
    share prefix-cache blocks. Embeddings without ids may share too when the
    spans cover every row (the talker's rows, each keyed by the thinker prefix
    it was made from). None (the default with embeddings) means the embeddings
    are not identified, and the prompt never shares. ``keys_outputs`` False
    keeps the generated rows out of the prefix index (a stage that keeps per-slot
    state beside the KV, written only for prompt rows: Qwen2.5-Omni's thinker).
    """

    def __init__(
        self,
        request_id: str,
        prompt_token_ids: list[int] | None,
        sampling_params: SamplingParams,
        *,
        prompt_embeds: torch.Tensor | None = None,
        prompt_positions: torch.Tensor | None = None,
        rope_delta: int = 0,
        eos_token_id: int | None = None,
        stage_data: object | None = None,
        arrival_time: float | None = None,
        mm_spans: tuple[MultimodalSpan, ...] | None = None,
        keys_outputs: bool = True,
    ) -> None:
        self.request_id = request_id
        self.prompt_token_ids = list(prompt_token_ids or [])
        self.prompt_embeds = prompt_embeds
        self.num_prompt_tokens = len(prompt_embeds) if prompt_embeds is not None else len(self.prompt_token_ids)
        _validate_prompt(self.prompt_token_ids, prompt_embeds, prompt_positions, self.num_prompt_tokens)
        if prompt_embeds is not None and not self.prompt_token_ids and mm_spans is not None:
            _validate_cover(mm_spans, self.num_prompt_tokens)
        self.prompt_positions = prompt_positions
        self.rope_delta = rope_delta
        self.sampling_params = sampling_params
        self.eos_token_id = eos_token_id
        self.stage_data = stage_data
        self.mm_spans = mm_spans
        self.keys_outputs = keys_outputs
        self.arrival_time = time.monotonic() if arrival_time is None else arrival_time

        self.output_token_ids: list[int] = []
        self.num_computed_tokens = 0
        self.num_cached_tokens = -1  # prompt tokens served from the prefix cache at first admission
        self.num_preemptions = 0
        self.status = RequestStatus.WAITING
        self.finish_reason: FinishReason | None = None
        # Chained hashes of this request's full blocks, extended as blocks fill (prefix caching).
        self.block_hashes: list[bytes] = []

    @property
    def num_tokens(self) -> int:
        return self.num_prompt_tokens + len(self.output_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    @property
    def is_finished(self) -> bool:
        return self.status is RequestStatus.FINISHED

    @property
    def prefix_cacheable(self) -> bool:
        """Token prompts, and embedding prompts identified by ids + multimodal item hashes (``mm_spans``) or by
        spans over every row."""
        return self.prompt_embeds is None or self.mm_spans is not None

    @property
    def num_keyed_tokens(self) -> int:
        """Leading tokens whose KV the ids and spans identify: all of them, except after a prompt of embeddings
        keyed by spans alone (the talker's), whose generated rows are more than their ids (whole codec frames
        and the thinker's text), so they are never cached, and after a request whose ``keys_outputs`` is False."""
        if not self.keys_outputs or (self.prompt_embeds is not None and not self.prompt_token_ids):
            return self.num_prompt_tokens
        return self.num_tokens

    def mm_spans_in(self, start: int, end: int) -> list[MultimodalSpan]:
        """The multimodal items that overlap positions ``[start, end)`` (a block's extra hash keys)."""
        return [s for s in self.mm_spans or () if s.start < end and s.end > start]

    def token_id(self, pos: int) -> int:
        """The input id at position ``pos``; 0 for embedding-only prompt positions."""
        if pos >= self.num_prompt_tokens:
            return self.output_token_ids[pos - self.num_prompt_tokens]
        return self.prompt_token_ids[pos] if self.prompt_token_ids else 0

    def token_ids(self, start: int, end: int) -> list[int]:
        """Input ids of positions ``start:end`` (prompt then generated; 0 for embedding-only prompts)."""
        base = self.num_prompt_tokens
        if start >= base:
            return self.output_token_ids[start - base:end - base]
        head = self.prompt_token_ids[start:end] if self.prompt_token_ids else [0] * (min(end, base) - start)
        return head + self.output_token_ids[:end - base] if end > base else head

    def seen_token_ids(self) -> list[int]:
        """Ids the repetition penalty counts: real prompt ids (if any) and every output."""
        return self.prompt_token_ids + self.output_token_ids

    def finish(self, reason: FinishReason) -> None:
        self.status = RequestStatus.FINISHED
        self.finish_reason = reason

    def __repr__(self) -> str:
        return (f"Request({self.request_id!r}, status={self.status.value}, tokens={self.num_tokens}, "
                f"computed={self.num_computed_tokens})")


def _validate_prompt(
    ids: list[int], embeds: torch.Tensor | None, positions: torch.Tensor | None, length: int
) -> None:
    if length == 0:
        raise ValueError("a request needs a non-empty prompt (token ids or embeddings)")
    if embeds is not None and (embeds.dim() != 2 or (ids and len(ids) != len(embeds))):
        raise ValueError(f"prompt_embeds must be [L, H] with L matching the {len(ids)} prompt ids")
    if positions is not None and positions.shape[-1] != length:
        raise ValueError(f"prompt_positions cover {positions.shape[-1]} tokens, the prompt has {length}")


def _validate_cover(spans: tuple[MultimodalSpan, ...], length: int) -> None:
    """Embeddings without ids are identified by their spans alone: every row must lie in one."""
    covered = 0
    for span in sorted(spans, key=lambda s: s.start):
        if span.start > covered:
            break
        covered = max(covered, span.end)
    if covered < length:
        raise ValueError(f"an embedding prompt without ids keyed by spans needs them to cover all {length} rows "
                         f"(row {covered} is in none)")
