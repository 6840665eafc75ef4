"""The code predictor: fills in codebooks 1..G-1 of a talker frame from the talker's last hidden state.

For each frame it runs a short causal sequence with 1-D RoPE:
``[talker hidden, embed(code 0), embed_0(code 1), ..., embed_{G-3}(code G-2)]``;
the output at position ``g + 1`` goes through ``lm_head[g]`` to give code
``g + 1``. Code ``g`` (g >= 1) is embedded with ``codec_embedding[g - 1]``.
That is transformers' ``Qwen3OmniMoeTalkerCodePredictorModelForConditionalGeneration``
driven by ``generate(max_new_tokens=G-1)``.

Here the ``G - 1`` steps run batched over the N frames of one talker step, in
lockstep (frame i owns row i of a contiguous cache; :class:`LockstepStack` runs the passes).
At real widths these 15 sequential passes dominate the talker, so the loop
allocates nothing per call that it can keep: caches, attention metadata and
positions live in a :class:`PredictorWorkspace` reused across frames and steps,
and sampling is a tensor-only :class:`CodeSampler` (noise drawn beforehand), so
the whole loop is capturable in one CUDA graph per batch size.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from omnistage.models.decoder import Decoder, DecoderConfig, decoder_config
from omnistage.models.predictor_workspace import CodeSampler, GreedyCodes, PredictorWorkspace

if TYPE_CHECKING:
    from transformers import PretrainedConfig


class CodePredictorModel(Decoder):
    def __init__(self, cfg: DecoderConfig, vocab_size: int, num_code_groups: int) -> None:
        super().__init__(cfg)
        self.codec_embedding = nn.ModuleList(
            nn.Embedding(vocab_size, cfg.hidden_size) for _ in range(num_code_groups - 1)
        )


class CodePredictor(nn.Module):
    """Names mirror the checkpoint under ``talker.code_predictor.``: ``model.*``, ``lm_head.{g}``."""

    def __init__(self, config: PretrainedConfig) -> None:
        super().__init__()
        self.num_code_groups = config.num_code_groups
        if self.num_code_groups < 2:
            raise ValueError(f"num_code_groups={self.num_code_groups}: nothing for a code predictor to predict")
        cfg = decoder_config(config, mrope=False)
        self.model = CodePredictorModel(cfg, config.vocab_size, self.num_code_groups)
        self.lm_head = nn.ModuleList(
            nn.Linear(cfg.hidden_size, config.vocab_size, bias=False) for _ in range(self.num_code_groups - 1)
        )
        self.workspace = PredictorWorkspace(cfg, self.num_code_groups)

    def embed_code(self, group: int, codes: torch.Tensor) -> torch.Tensor:
        """Embedding of codes of codebook ``group`` (1..G-1)."""
        return self.model.codec_embedding[group - 1](codes)

    @torch.no_grad()
    def predict(
        self, talker_hidden: torch.Tensor, code0_embed: torch.Tensor, sampler: CodeSampler | None = None
    ) -> torch.Tensor:
        """talker_hidden, code0_embed ``[N, H]`` -> codes of groups 1..G-1 ``[N, G-1]``."""
        sampler = sampler or GreedyCodes()
        num_groups, n = self.num_code_groups, talker_hidden.shape[0]
        passes = self.workspace.passes(self.model, n, talker_hidden)
        x = torch.stack([talker_hidden, code0_embed], dim=1).flatten(0, 1)  # [2N, H]: hidden then code 0, per frame
        codes: list[torch.Tensor] = []
        for step in range(num_groups - 1):
            code = sampler.sample(self.lm_head[step](passes.run(x, step)), step)
            codes.append(code)
            if step + 2 < num_groups:
                x = self.embed_code(step + 1, code)
        return torch.stack(codes, dim=1)
