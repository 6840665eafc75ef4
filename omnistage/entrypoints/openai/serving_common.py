"""Checks and conversions shared by the chat and speech endpoints."""

from __future__ import annotations

from collections.abc import Sequence

from omnistage.core import FinishReason, OmniOutput, RequestSampling, Usage
from omnistage.entrypoints.openai.engine_protocol import OmniEngine
from omnistage.entrypoints.openai.errors import SERVER_ERROR, APIError, bad_request, model_not_found
from omnistage.entrypoints.openai.protocol import FinishReasonName
from omnistage.entrypoints.openai.streaming import TIMED_OUT


def check_model(engine: OmniEngine, name: str) -> None:
    if name != engine.model_name:
        raise model_not_found(name)


def resolve_voice(engine: OmniEngine, name: str, param: str) -> str:
    """The engine's spelling of ``name``, matched case-insensitively (``ethan`` → ``Ethan``)."""
    by_key = {v.lower(): v for v in engine.voices}
    voice = by_key.get(name.strip().lower())
    if voice is None:
        known = ", ".join(engine.voices) or "none"
        raise bad_request(f"unknown voice {name!r}; this model has: {known}", param=param, code="invalid_voice")
    return voice


def require_audio_support(engine: OmniEngine, param: str) -> None:
    if not engine.supports_audio:
        raise bad_request("this model is served text-only (its checkpoint has no talker/code2wav); "
                          "request modalities ['text']", param=param, code="audio_not_supported")


def completion_budget(requested: int | None, prompt_len: int, max_model_len: int, param: str) -> int:
    """Completion tokens for this request: the client's ask, or all the context the prompt leaves."""
    room = max_model_len - prompt_len
    if room < 1:
        raise bad_request(f"the prompt is {prompt_len} tokens; this model's context is {max_model_len}",
                          param="messages", code="context_length_exceeded")
    if requested is not None and requested > room:
        raise bad_request(f"{param}={requested} plus the prompt's {prompt_len} tokens exceeds the model's "
                          f"context of {max_model_len}", param=param, code="context_length_exceeded")
    return requested if requested is not None else room


def top_k_of(engine: OmniEngine, top_k: int | None) -> int | None:
    """The request's top-k for the sampler: -1 and 0 mean off (vLLM's and HF's spellings); more than the
    vocabulary is a 400 (the vocabulary is the tokenizer's, when the model has one)."""
    if top_k is None or top_k <= 0:
        return None if top_k is None else 0
    tokenizer = getattr(engine.processor, "tokenizer", None)
    vocab = len(tokenizer) if tokenizer is not None else None
    if vocab is not None and top_k > vocab:
        raise bad_request(f"top_k={top_k} is larger than the model's vocabulary of {vocab} tokens", param="top_k",
                          code="invalid_value")
    return top_k


def make_sampling(*, max_tokens: int, temperature: float | None = None, top_p: float | None = None,
                  top_k: int | None = None, repetition_penalty: float | None = None, seed: int | None = None,
                  stop: Sequence[str] = ()) -> RequestSampling:
    defaults = RequestSampling()
    try:
        return RequestSampling(
            temperature=defaults.temperature if temperature is None else temperature,
            top_p=defaults.top_p if top_p is None else top_p,
            top_k=defaults.top_k if top_k is None else top_k,
            repetition_penalty=defaults.repetition_penalty if repetition_penalty is None else repetition_penalty,
            max_tokens=max_tokens, seed=seed, stop=tuple(stop),
        )
    except ValueError as exc:
        raise bad_request(str(exc)) from exc


def engine_failure(out: OmniOutput | None) -> APIError | None:
    """The error to answer with when the engine ended a request without completing it, else None."""
    if out is None or not out.finished:
        return APIError(500, "the engine ended the request without a final output", type=SERVER_ERROR)
    if out.finish_reason is FinishReason.ERROR:
        return APIError(500, f"the engine failed: {out.error or 'unknown error'}", type=SERVER_ERROR)
    if out.finish_reason is FinishReason.ABORT and (out.error or "").startswith(TIMED_OUT):
        return APIError(504, f"{out.error} (--request-timeout)", type=SERVER_ERROR, code="timeout")
    if out.finish_reason is FinishReason.ABORT:
        return APIError(503, "the request was aborted by the server", type=SERVER_ERROR, code="aborted")
    return None


def finish_reason_name(reason: FinishReason | None) -> FinishReasonName:
    return "length" if reason is FinishReason.LENGTH else "stop"


def usage_of(out: OmniOutput, prompt_len: int, completion_tokens: int) -> Usage:
    """The engine's count when it gives one; else what the server saw stream past."""
    return out.usage if out.usage is not None else Usage(prompt_len, completion_tokens)
