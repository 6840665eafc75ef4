"""The code predictor: fills in codebooks 1..G-1 of a talker frame from the talker's last hidden state.

For each frame it runs a short causal sequence with 1-D RoPE:
``[talker hidden, embed(code 0), embed_0(code 1), ..., embed_{G-3}(code G-2)]``;
the output at position ``g + 1`` goes through ``lm_head[g]`` to give code
``g + 1``. Code ``g`` (g >= 1) is embedded with ``codec_embedding[g - 1]``.
That is transformers' ``Qwen3OmniMoeTalkerCodePredictorModelForConditionalGeneration``
driven by ``generate(max_new_tokens=G-1)``.

Here the ``G - 1`` steps run batched over the N frames of one talker step, with
a private KV cache for the call: one cache block of ``G`` slots per frame, read
through the same attention backend as every other decoder (so a GPU backend
serves it too).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch
from torch import nn

from omnistage.layers.attention.base import AttentionBackend, AttentionMetadata
from omnistage.layers.attention.context import ForwardContext, forward_context
from omnistage.layers.attention.torch_sdpa import TorchSDPABackend
from omnistage.models.qwen3_omni.decoder import Decoder, DecoderConfig, decoder_config

if TYPE_CHECKING:
    from transformers import PretrainedConfig

# logits [N, vocab] -> token ids [N]
SampleFn = Callable[[torch.Tensor], torch.Tensor]


def greedy(logits: torch.Tensor) -> torch.Tensor:
    return logits.argmax(dim=-1)


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
        # The runner may swap in its device's backend; the predictor's cache layout suits any paged backend.
        self.backend: AttentionBackend = TorchSDPABackend()

    def embed_code(self, group: int, codes: torch.Tensor) -> torch.Tensor:
        """Embedding of codes of codebook ``group`` (1..G-1)."""
        return self.model.codec_embedding[group - 1](codes)

    @torch.no_grad()
    def predict(
        self, talker_hidden: torch.Tensor, code0_embed: torch.Tensor, sample_fn: SampleFn | None = None
    ) -> torch.Tensor:
        """talker_hidden, code0_embed ``[N, H]`` -> codes of groups 1..G-1 ``[N, G-1]``."""
        sample = sample_fn or greedy
        num_groups, n = self.num_code_groups, talker_hidden.shape[0]
        caches = self._new_caches(n, talker_hidden)
        x = torch.stack([talker_hidden, code0_embed], dim=1).flatten(0, 1)  # [2N, H]: hidden then code 0, per frame
        codes: list[torch.Tensor] = []
        for step in range(num_groups - 1):
            num_new, context = (2 if step == 0 else 1), step + 2
            meta = _step_metadata(n, num_new, context, num_groups, x.device)
            positions = torch.arange(context - num_new, context, device=x.device).repeat(n)
            with forward_context(ForwardContext(meta, self.backend, caches)):
                hidden, _ = self.model(x, positions)
            last = hidden.view(n, num_new, -1)[:, -1]
            code = sample(self.lm_head[step](last))
            codes.append(code)
            if step + 2 < num_groups:
                x = self.embed_code(step + 1, code)
        return torch.stack(codes, dim=1)

    def _new_caches(self, n: int, like: torch.Tensor) -> list[torch.Tensor]:
        """One block of ``num_code_groups`` slots per frame and layer (zeros: never read unwritten)."""
        cfg = self.model.cfg
        shape = (2, n, self.num_code_groups, cfg.num_kv_heads, cfg.head_dim)
        return [like.new_zeros(shape) for _ in range(cfg.num_layers)]


def _step_metadata(n: int, num_new: int, context: int, block_size: int, device: torch.device) -> AttentionMetadata:
    """N sequences, each adding ``num_new`` tokens to reach ``context``; sequence i owns cache block i."""
    seq = torch.arange(n, device=device)
    slots = seq[:, None] * block_size + torch.arange(context - num_new, context, device=device)[None, :]
    return AttentionMetadata(
        query_start_loc=torch.arange(n + 1, device=device, dtype=torch.int32) * num_new,
        context_lens=torch.full((n,), context, device=device, dtype=torch.int32),
        slot_mapping=slots.flatten(),
        block_tables=seq[:, None].to(torch.int32),
        query_lens=[num_new] * n,
        context_lens_cpu=[context] * n,
    )
