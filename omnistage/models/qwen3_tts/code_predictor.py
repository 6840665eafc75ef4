"""Qwen3-TTS's code predictor: codebooks 1..G-1 of a frame from the talker's last hidden state and code 0.

The reference (``Qwen3TTSTalkerCodePredictorModelForConditionalGeneration`` driven by ``generate(max_new_tokens=G-1)``)
runs a short causal sequence ``[talker hidden, embed(code 0), embed_0(code 1), ...]``, each row first mapped
through ``small_to_mtp_projection`` (a linear when the predictor is narrower than the talker, as in the 1.7B
model; identity otherwise); the output at position ``g + 1`` gives code ``g + 1`` through ``lm_head[g]``. Its code
embeddings are as wide as the talker, because the talker sums them into its next input.

Here the ``G - 1`` steps run batched over the N frames of one talker step in lockstep, over the same reusable
workspace as Qwen3-Omni's predictor (caches, metadata and positions kept across calls; sampling tensor-only),
so the loop is capturable in one CUDA graph per batch size. Names mirror the checkpoint under
``talker.code_predictor.``.
"""

from __future__ import annotations

import torch
from torch import nn

from omnistage.models.predictor_workspace import CodeSampler, GreedyCodes, PredictorWorkspace
from omnistage.models.decoder import Decoder
from omnistage.models.qwen3_tts.config import CodePredictorConfig


class PredictorModel(Decoder):
    def __init__(self, config: CodePredictorConfig, embedding_dim: int) -> None:
        super().__init__(config.stack)
        self.codec_embedding = nn.ModuleList(
            nn.Embedding(config.vocab_size, embedding_dim) for _ in range(config.num_code_groups - 1))


class CodePredictor(nn.Module):
    def __init__(self, config: CodePredictorConfig, talker_hidden_size: int) -> None:
        super().__init__()
        if config.num_code_groups < 2:
            raise ValueError(f"num_code_groups={config.num_code_groups}: nothing for a code predictor to predict")
        self.num_code_groups = config.num_code_groups
        hidden = config.stack.hidden_size
        self.model = PredictorModel(config, talker_hidden_size)
        self.lm_head = nn.ModuleList(
            nn.Linear(hidden, config.vocab_size, bias=False) for _ in range(config.num_code_groups - 1))
        self.small_to_mtp_projection: nn.Module = (
            nn.Linear(talker_hidden_size, hidden, bias=True) if hidden != talker_hidden_size else nn.Identity())
        self.workspace = PredictorWorkspace(config.stack, self.num_code_groups)

    def embed_code(self, group: int, codes: torch.Tensor) -> torch.Tensor:
        """Talker-width embedding of codes of codebook ``group`` (1..G-1)."""
        return self.model.codec_embedding[group - 1](codes)

    @torch.no_grad()
    def predict(self, talker_hidden: torch.Tensor, code0_embed: torch.Tensor,
                sampler: CodeSampler | None = None) -> torch.Tensor:
        """talker_hidden, code0_embed ``[N, H_talker]`` -> codes of groups 1..G-1 ``[N, G-1]``."""
        sampler = sampler or GreedyCodes()
        num_groups, n = self.num_code_groups, talker_hidden.shape[0]
        x = self.small_to_mtp_projection(torch.stack([talker_hidden, code0_embed], dim=1).flatten(0, 1))
        passes = self.workspace.passes(self.model, n, x)
        codes: list[torch.Tensor] = []
        for step in range(num_groups - 1):
            code = sampler.sample(self.lm_head[step](passes.run(x, step)), step)
            codes.append(code)
            if step + 2 < num_groups:
                x = self.small_to_mtp_projection(self.embed_code(step + 1, code))
        return torch.stack(codes, dim=1)
