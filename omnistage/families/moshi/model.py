"""Moshi's language model as one module under transformers' names: audio embeddings, temporal decoder, depth decoder.

``MoshiLM.state_dict()`` has transformers' ``MoshiForConditionalGeneration`` keys less its ``audio_encoder``
(Mimi is a codec stage of its own), so the transformers layout loads as is and Kyutai's is renamed onto it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from omnistage.families.moshi.config import MoshiConfig
from omnistage.families.moshi.depth import Depth
from omnistage.families.moshi.temporal import Decoder

Chooser = Callable[[torch.Tensor, int], torch.Tensor]


class MoshiLM(nn.Module):
    def __init__(self, cfg: MoshiConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.embed_tokens = nn.ModuleList(nn.Embedding(cfg.audio_vocab_size + 1, cfg.hidden_size)
                                          for _ in range(2 * cfg.num_codebooks))
        self.decoder = Decoder(cfg)
        self.depth_decoder = Depth(cfg)

    def embed(self, text: torch.Tensor, audio: torch.Tensor) -> torch.Tensor:
        """``text`` [B, T] and ``audio`` [B, 2K, T] (the agent's codes, then the user's) → [B, T, H], summed in
        transformers' order (the audio tables first, then the text) so sums round alike."""
        total = 0
        for k, table in enumerate(self.embed_tokens):
            total = total + table(audio[:, k])
        return total + self.decoder.model.embed_tokens(text)


@dataclass(frozen=True)
class DuplexSampling:
    """How a session's tokens are picked: temperature 0 is greedy. Defaults are Kyutai's (text 0.7/25, audio
    0.8/250)."""

    text_temperature: float = 0.7
    text_top_k: int = 25
    audio_temperature: float = 0.8
    audio_top_k: int = 250
    seed: int = 0

    @classmethod
    def greedy(cls) -> DuplexSampling:
        return cls(0.0, 1, 0.0, 1)


def chooser(temperature: float, top_k: int, generator: torch.Generator | None) -> Chooser:
    """Picks one token per row of ``[B, V]`` logits: the argmax, or a draw among the top ``top_k`` at
    ``temperature`` from ``generator`` (the engine's own, seeded: nothing process-wide)."""
    def choose(logits: torch.Tensor, step: int) -> torch.Tensor:
        if temperature <= 0:
            return logits.argmax(dim=-1)
        values, ids = logits.float().topk(min(top_k, logits.shape[-1]), dim=-1)
        probs = torch.softmax(values / temperature, dim=-1)
        return ids.gather(-1, torch.multinomial(probs, 1, generator=generator)).squeeze(-1)
    return choose
