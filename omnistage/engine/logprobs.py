"""A sampled token's log-probability and its most likely alternatives (what ``logprobs`` asks for).

A msgspec struct, so it crosses from a stage replica to the orchestrator as it is.
"""

from __future__ import annotations

import msgspec


class TokenLogprob(msgspec.Struct, frozen=True):
    """``logprob`` of the sampled ``token_id``; ``top``: the k most likely ``(token id, logprob)``, best first."""

    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()
