"""How a request picks its tokens: the one sampling type, from the API to the sampler.

A caller's request carries one (``OmniRequest.sampling``), a stage config's
``sampling:`` is one, the server's defaults are one, and a stage engine's
sampler reads one. Frozen and validated once at construction (also when decoded
off the wire): the sampler reads these into batched tensors, so an invalid
value must fail here rather than as a NaN deep inside a batched step. The
struct itself crosses the process boundary (msgspec), so there is no wire copy.
Light on purpose (no torch): config parsing and the front end import it.
"""

from __future__ import annotations

import math

import msgspec

# Ranges no request can leave without breaking its batch's tensors: seeds as OpenAI/vLLM take them (a
# torch generator takes < 2**64), top-k within int32, repetition penalties far from overflowing a float32
# logit. The API takes repetition penalties up to REPETITION_PENALTY_MAX (vLLM's bound) and temperatures up to
# TEMPERATURE_MAX (OpenAI's), checked where requests come in (entrypoints/); the engine, which tests and tools
# drive directly, takes repetition penalties up to ENGINE_REPETITION_PENALTY_MAX and any finite temperature.
SEED_MAX = 2**63 - 1
TOP_K_MAX = 2**31 - 1
REPETITION_PENALTY_MIN = 0.01
REPETITION_PENALTY_MAX = 2.0
ENGINE_REPETITION_PENALTY_MAX = 100.0
TEMPERATURE_MAX = 2.0
# OpenAI's presence/frequency penalty range (subtracted from a logit once / per occurrence).
OPENAI_PENALTY_MAX = 2.0
MAX_LOGPROBS = 20  # OpenAI's top_logprobs bound


def _check_ranges(temperature: float, top_p: float, top_k: int, repetition_penalty: float, seed: int | None) -> None:
    """``ValueError`` naming the first field out of its range; the message starts with the field's name, which a
    stage config error takes for its path and a 400 shows the caller."""
    if not math.isfinite(temperature) or temperature < 0.0:
        raise ValueError(f"temperature must be a finite number >= 0, got {temperature}")
    if not 0.0 < top_p <= 1.0:  # also false for NaN
        raise ValueError(f"top_p must be in (0, 1], got {top_p}")
    if not 0 <= top_k <= TOP_K_MAX:
        raise ValueError(f"top_k must be in [0, {TOP_K_MAX}] (0 disables), got {top_k}")
    if not REPETITION_PENALTY_MIN <= repetition_penalty <= ENGINE_REPETITION_PENALTY_MAX:
        raise ValueError(f"repetition_penalty must be in [{REPETITION_PENALTY_MIN}, {ENGINE_REPETITION_PENALTY_MAX}], "
                         f"got {repetition_penalty}")
    if seed is not None and not 0 <= seed <= SEED_MAX:
        raise ValueError(f"seed must be in [0, {SEED_MAX}], got {seed}")


def _check_openai_penalties(presence_penalty: float, frequency_penalty: float) -> None:
    for name, value in (("presence_penalty", presence_penalty), ("frequency_penalty", frequency_penalty)):
        if not -OPENAI_PENALTY_MAX <= value <= OPENAI_PENALTY_MAX:  # also false for NaN
            raise ValueError(f"{name} must be in [-{OPENAI_PENALTY_MAX:g}, {OPENAI_PENALTY_MAX:g}], got {value}")


class SamplingParams(msgspec.Struct, frozen=True):
    """How one request picks its next token.

    temperature: 0 means greedy (argmax); otherwise logits are divided by it.
    top_p: nucleus mass kept, in (0, 1]; 1 disables.
    top_k: keep the k best tokens; 0 disables.
    repetition_penalty: Hugging Face style (divide positive logits / multiply
        negative ones of every token already seen); 1 disables.
    seed: makes this request's random draws reproducible whatever else shares
        its batch; None draws from the engine's shared generator.
    max_tokens: stop after this many generated tokens; None: once the context is full (the engine's
        ``max_model_len``), as in vLLM. The server's defaults hold None unless the checkpoint sets
        ``max_new_tokens``; the front ends then give each request the room its prompt leaves.
    min_tokens: EOS and stop tokens are masked out until this many were made.
    stop_token_ids: generation stops after emitting any of these.
    ignore_eos: keep going past EOS (benchmarks with fixed lengths).
    presence_penalty / frequency_penalty: OpenAI's, over generated tokens: a token's logit loses
        ``presence`` once it was generated and ``frequency`` per time it was; 0 disables.
    logprobs: None = none; k >= 0 = the sampled token's log-probability and the k most likely
        (from the model's raw logits, before penalties and temperature, as vLLM reports them).
    stop: strings that end the text; matched on the detokenised text by the pipeline, not by the engine.
    """

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    repetition_penalty: float = 1.0
    seed: int | None = None
    max_tokens: int | None = None
    min_tokens: int = 0
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logprobs: int | None = None
    stop: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        # Lists (and one stop string) are accepted for convenience but stored as tuples so the object stays hashable.
        msgspec.structs.force_setattr(self, "stop_token_ids", tuple(int(t) for t in self.stop_token_ids))
        msgspec.structs.force_setattr(self, "stop", (self.stop,) if isinstance(self.stop, str) else tuple(self.stop))
        _check_ranges(self.temperature, self.top_p, self.top_k, self.repetition_penalty, self.seed)
        if self.max_tokens is not None and self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")
        if self.min_tokens < 0 or self.max_tokens is not None and self.min_tokens > self.max_tokens:
            raise ValueError(f"min_tokens must be in [0, max_tokens], got {self.min_tokens}")
        _check_openai_penalties(self.presence_penalty, self.frequency_penalty)
        if self.logprobs is not None and not 0 <= self.logprobs <= MAX_LOGPROBS:
            raise ValueError(f"logprobs must be in [0, {MAX_LOGPROBS}], got {self.logprobs}")

    def with_floor(self, floor: int) -> SamplingParams:
        """These settings with EOS and stop tokens held back for at least ``floor`` tokens (or this request's own
        ``min_tokens``, if more), never past ``max_tokens``: a talker's floor (a random test checkpoint would stop
        at once; Qwen3-TTS's reference makes two steps)."""
        wanted = max(self.min_tokens, floor)
        cap = wanted if self.max_tokens is None else self.max_tokens
        return msgspec.structs.replace(self, min_tokens=min(wanted, cap))

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def counts_outputs(self) -> bool:
        """Whether the sampler needs this request's generated-token counts (presence/frequency penalties)."""
        return self.presence_penalty != 0.0 or self.frequency_penalty != 0.0

    @property
    def needs_sort(self) -> bool:
        """Whether top-k/top-p filtering (a sort over the vocabulary) is needed."""
        return not self.greedy and (self.top_k > 0 or self.top_p < 1.0)
