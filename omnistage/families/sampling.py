"""Per-stage sampling of one request: the caller's knobs for a text stage, stage defaults for a talker."""

from __future__ import annotations

from omnistage.core import RequestSampling
from omnistage.sampling_params import SamplingParams


def request_params(s: RequestSampling) -> SamplingParams:
    """Temperature 0 is greedy; stop strings are matched on text by the orchestrator, not here."""
    return SamplingParams(temperature=s.temperature, top_p=s.top_p, top_k=s.top_k,
                          repetition_penalty=s.repetition_penalty, seed=s.seed, max_tokens=s.max_tokens,
                          min_tokens=min(s.min_tokens, s.max_tokens), ignore_eos=s.ignore_eos,
                          presence_penalty=s.presence_penalty, frequency_penalty=s.frequency_penalty,
                          logprobs=s.logprobs, stop_token_ids=s.stop_token_ids)


def stage_params(stage: SamplingParams, seed: int | None, min_new_tokens: int = 0,
                 prefill_only: bool = False) -> SamplingParams:
    """A stage's configured defaults, seeded from the request so one seed always gives the same audio.

    ``min_new_tokens`` keeps a randomly initialised talker from ending on its first frame (tests).
    ``prefill_only``: the request only warms the stage's prefix cache, so it runs one step (its prefill) and no
    floor holds it longer.
    """
    max_tokens = 1 if prefill_only else stage.max_tokens
    min_tokens = 0 if prefill_only else min(min_new_tokens, max_tokens)
    return SamplingParams(temperature=stage.temperature, top_p=stage.top_p, top_k=stage.top_k,
                          repetition_penalty=stage.repetition_penalty, seed=seed, max_tokens=max_tokens,
                          min_tokens=min_tokens)
