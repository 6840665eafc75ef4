"""How an utterance picks each code: greedy at temperature 0, else temperature, top-k and top-p, then a draw
from its own generator (a seeded request repeats whatever shares its steps). Every codebook of a frame is
picked the same way, as Sesame's generator samples them."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from omnistage.runner.sampler import apply_top_k_top_p
from omnistage.sampling_params import SamplingParams


@dataclass
class CodeSampling:
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    generator: torch.Generator | None = None

    @classmethod
    def of(cls, params: SamplingParams) -> CodeSampling:
        generator = torch.Generator().manual_seed(params.seed) if params.seed is not None else None
        return cls(params.temperature, params.top_k, params.top_p, generator)

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0


def pick_codes(logits: torch.Tensor, samplings: Sequence[CodeSampling]) -> torch.Tensor:
    """``[B, vocab]`` float logits -> ``[B]`` codes, row ``i`` picked as ``samplings[i]`` says."""
    codes = logits.argmax(dim=-1)
    drawn = [i for i, s in enumerate(samplings) if not s.greedy]
    if not drawn:
        return codes
    rows = torch.tensor(drawn, device=logits.device)
    temperature = torch.tensor([samplings[i].temperature for i in drawn], device=logits.device)
    top_k = torch.tensor([samplings[i].top_k for i in drawn], device=logits.device)
    top_p = torch.tensor([samplings[i].top_p for i in drawn], device=logits.device, dtype=logits.dtype)
    probs = torch.softmax(apply_top_k_top_p(logits[rows] / temperature[:, None], top_k, top_p), dim=-1).cpu()
    for row, i in enumerate(drawn):
        codes[i] = int(torch.multinomial(probs[row], 1, generator=samplings[i].generator))
    return codes
