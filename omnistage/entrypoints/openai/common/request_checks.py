"""Checks and conversions shared by the chat, speech and realtime endpoints."""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

from omnistage.core import FinishReason, OmniOutput, Usage
from omnistage.entrypoints.openai.common.errors import SERVER_ERROR, APIError, bad_request
from omnistage.entrypoints.openai.common.streaming import TIMED_OUT
from omnistage.entrypoints.openai.common.voice_names import UnknownVoice, VoiceBook
from omnistage.entrypoints.openai.engine_protocol import OmniEngine
from omnistage.sampling_params import TEMPERATURE_MAX, SamplingParams


def resolve_voice(voices: VoiceBook, name: str | None, param: str) -> str:
    """The checkpoint's speaker for ``name`` (a speaker, matched case-insensitively, or an OpenAI voice name);
    None: the default voice."""
    try:
        return voices.resolve(name)
    except UnknownVoice as exc:
        raise bad_request(str(exc), param=param, code="invalid_voice") from exc


NO_CHAT = ("this model takes no chat: it is a text-to-speech checkpoint; use POST /v1/audio/speech")


NO_CHAT_RECOGNISER = ("this model takes no chat: it is a speech recogniser; use POST /v1/audio/transcriptions or a "
                      "realtime transcription session")
NO_SPEECH_RECOGNISER = ("this model cannot speak: it is a speech recogniser; use POST /v1/audio/transcriptions, or "
                        "serve a text-to-speech or omni checkpoint for /v1/audio/speech")


NO_REQUESTS_DUPLEX = ("this model takes no requests: it is a full-duplex speech model, listening and speaking at "
                      "once; open a GPT-Live session at /v1/live/sessions (a WebSocket, or WebRTC by POST)")


def no_chat(engine: OmniEngine) -> str:
    """Why this checkpoint takes no chat, in its own terms (a TTS checkpoint's, a recogniser's, a duplex model's)."""
    if engine.front_end.duplex:
        return NO_REQUESTS_DUPLEX
    return NO_CHAT_RECOGNISER if engine.front_end.transcriber is not None else NO_CHAT


def require_requests(engine: OmniEngine, param: str = "model") -> None:
    """A duplex model serves GPT-Live sessions only: every request-shaped route refuses it first (400)."""
    if engine.front_end.duplex:
        raise bad_request(NO_REQUESTS_DUPLEX, param=param, code="model_not_supported")


def require_chat(engine: OmniEngine) -> None:
    if engine.front_end.processor is None:
        raise bad_request(no_chat(engine), param="model", code="chat_not_supported")


def require_audio_support(engine: OmniEngine, param: str) -> None:
    require_requests(engine, param)
    if engine.front_end.transcriber is not None and engine.front_end.processor is None:
        raise bad_request(NO_SPEECH_RECOGNISER, param=param, code="audio_not_supported")
    if not engine.supports_audio:
        raise bad_request("this model is served text-only (its checkpoint has no talker/code2wav); "
                          "request modalities ['text']", param=param, code="audio_not_supported")


def completion_budget(requested: int | None, prompt_len: int, max_model_len: int, param: str,
                      default: int | None = None) -> int:
    """Completion tokens for this request: the client's ask, else ``default`` (the checkpoint's
    ``max_new_tokens``), else all the context the prompt leaves; a default past the context is cut to it."""
    room = max_model_len - prompt_len
    if room < 1:
        raise bad_request(f"the prompt is {prompt_len} tokens; this model's context is {max_model_len}",
                          param="messages", code="context_length_exceeded")
    if requested is not None and requested > room:
        raise bad_request(f"{param}={requested} plus the prompt's {prompt_len} tokens exceeds the model's "
                          f"context of {max_model_len}", param=param, code="context_length_exceeded")
    if requested is not None:
        return requested
    return room if default is None else min(default, room)


def top_k_of(engine: OmniEngine, top_k: int | None) -> int | None:
    """The request's top-k for the sampler: -1 and 0 mean off (vLLM's and HF's spellings); more than the
    vocabulary is a 400 (the vocabulary is the tokenizer's, when the model has one)."""
    if top_k is None or top_k <= 0:
        return None if top_k is None else 0
    tokenizer = getattr(engine.front_end.processor, "tokenizer", None)
    vocab = len(tokenizer) if tokenizer is not None else None
    if vocab is not None and top_k > vocab:
        raise bad_request(f"top_k={top_k} is larger than the model's vocabulary of {vocab} tokens", param="top_k",
                          code="invalid_value")
    return top_k


def make_sampling(*, max_tokens: int, defaults: SamplingParams = SamplingParams(),  # noqa: B008 - frozen
                  temperature: float | None = None, top_p: float | None = None, top_k: int | None = None,
                  repetition_penalty: float | None = None, seed: int | None = None, stop: Sequence[str] = (),
                  min_tokens: int | None = None, **extra: object) -> SamplingParams:
    """The thinker's sampling: the server's defaults (the stage config under the checkpoint's generation config)
    with each knob the request sets (not None, stop strings not empty) replaced; ``extra``: further
    ``SamplingParams`` fields, as given. The API's temperature range is narrower than the engine's; ``min_tokens``
    past the budget is cut to it."""
    if temperature is not None and not 0.0 <= temperature <= TEMPERATURE_MAX:
        raise bad_request(f"temperature must be in [0, {TEMPERATURE_MAX:g}], got {temperature}", param="temperature")
    knobs = {"temperature": temperature, "top_p": top_p, "top_k": top_k, "repetition_penalty": repetition_penalty,
             "seed": seed, "stop": tuple(stop) or None}
    floor = defaults.min_tokens if min_tokens is None else min_tokens
    try:
        return msgspec.structs.replace(defaults, **{k: v for k, v in knobs.items() if v is not None},
                                       max_tokens=max_tokens, min_tokens=min(floor, max_tokens), **extra)
    except (TypeError, ValueError) as exc:
        raise bad_request(str(exc)) from exc


def engine_failure(out: OmniOutput | None) -> APIError | None:
    """The error to answer with when the engine ended a request without completing it, else None."""
    if out is None or not out.finished:
        return APIError(500, "the engine ended the request without a final output", type=SERVER_ERROR)
    if out.finish_reason is FinishReason.ERROR:
        # A code a client (or a WebSocket session's error event) can branch on: a request held by a stage replica
        # that died or stalled ends here too, and is worth retrying once /health is 200 again.
        return APIError(500, f"the engine failed: {out.error or 'unknown error'}", type=SERVER_ERROR,
                        code="engine_error")
    if out.finish_reason is FinishReason.ABORT and (out.error or "").startswith(TIMED_OUT):
        return APIError(504, f"{out.error} (--request-timeout)", type=SERVER_ERROR, code="timeout")
    if out.finish_reason is FinishReason.ABORT:
        return APIError(503, "the request was aborted by the server", type=SERVER_ERROR, code="aborted")
    return None


def usage_of(out: OmniOutput, prompt_len: int, completion_tokens: int) -> Usage:
    """The engine's count when it gives one; else what the server saw stream past."""
    return out.usage if out.usage is not None else Usage(prompt_len, completion_tokens)
