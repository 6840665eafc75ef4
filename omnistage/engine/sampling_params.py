"""Per-request sampling settings: frozen, validated once at construction.

The sampler reads these into batched tensors, so an invalid value must fail
here (at the API edge) rather than as a NaN deep inside a batched step.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class SamplingParams:
    """How one request picks its next token.

    temperature: 0 means greedy (argmax); otherwise logits are divided by it.
    top_p: nucleus mass kept, in (0, 1]; 1 disables.
    top_k: keep the k best tokens; 0 disables.
    repetition_penalty: Hugging Face style (divide positive logits / multiply
        negative ones of every token already seen); 1 disables.
    seed: makes this request's random draws reproducible whatever else shares
        its batch; None draws from the engine's shared generator.
    max_tokens: stop after this many generated tokens.
    min_tokens: EOS and stop tokens are masked out until this many were made.
    stop_token_ids: generation stops after emitting any of these.
    ignore_eos: keep going past EOS (benchmarks with fixed lengths).
    """

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    repetition_penalty: float = 1.0
    seed: int | None = None
    max_tokens: int = 16
    min_tokens: int = 0
    stop_token_ids: tuple[int, ...] = field(default_factory=tuple)
    ignore_eos: bool = False

    def __post_init__(self) -> None:
        # Lists are accepted for convenience but stored as tuples so the object stays hashable.
        object.__setattr__(self, "stop_token_ids", tuple(int(t) for t in self.stop_token_ids))
        if self.temperature < 0.0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0 disables), got {self.top_k}")
        if self.repetition_penalty <= 0.0:
            raise ValueError(f"repetition_penalty must be > 0, got {self.repetition_penalty}")
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")
        if not 0 <= self.min_tokens <= self.max_tokens:
            raise ValueError(f"min_tokens must be in [0, max_tokens], got {self.min_tokens}")
        if self.seed is not None and self.seed < 0:
            raise ValueError(f"seed must be >= 0, got {self.seed}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def needs_sort(self) -> bool:
        """Whether top-k/top-p filtering (a sort over the vocabulary) is needed."""
        return not self.greedy and (self.top_k > 0 or self.top_p < 1.0)
