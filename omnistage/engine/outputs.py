"""The typed messages of one engine step: scheduler → runner → scheduler → caller."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from omnistage.engine.logprobs import TokenLogprob
from omnistage.engine.request import FinishReason, Request


@dataclass
class ScheduledRequest:
    """One request's share of a step: ``num_new_tokens`` starting at its ``num_computed_tokens``.

    new_block_ids: blocks appended to its table for this step (prefix hits included).
    reset: first step since admission or re-admission after preemption; the runner
        rebuilds this request's table row instead of appending to it.
    """

    request: Request
    num_new_tokens: int
    new_block_ids: list[int]
    reset: bool

    @property
    def samples(self) -> bool:
        """Whether this step reaches the request's last token, so a new token is sampled."""
        return self.request.num_computed_tokens + self.num_new_tokens == self.request.num_tokens


@dataclass
class SchedulerOutput:
    scheduled: list[ScheduledRequest]
    num_tokens: int
    # Requests whose runner-side state must go: finished or aborted since the last step.
    finished_req_ids: list[str] = field(default_factory=list)
    # Requests that lost their blocks this step (their table rows are stale).
    preempted_req_ids: list[str] = field(default_factory=list)

    @property
    def is_empty(self) -> bool:
        return not self.scheduled


@dataclass
class ModelRunnerOutput:
    """sampled_token_ids: one per scheduled request, -1 where the step ended mid-prompt.
    extra: per-sampled-request rows a step hook adds (the talker's codec frames ``[n, G]``).
    failed_rows: scheduled rows whose sampling failed (non-finite logits); their requests end with an error.
    logprobs: by scheduled row, for the requests that asked (None when none did)."""

    sampled_token_ids: list[int]
    extra: torch.Tensor | None = None
    failed_rows: tuple[int, ...] = ()
    logprobs: dict[int, TokenLogprob] | None = None


@dataclass
class RequestOutput:
    """What one step produced for one request (streamed to the caller)."""

    request_id: str
    new_token_ids: list[int]
    finished: bool
    finish_reason: FinishReason | None = None
    # Talker: the codec frame(s) of this step, ``[len(new_token_ids), G]``.
    new_frames: torch.Tensor | None = None
    error: str | None = None  # why, when finish_reason is ERROR
    logprobs: list[TokenLogprob] | None = None  # one per new token, when the request asked
