"""The talker: a MoE decoder that turns thinker states into codec frames, one frame per step.

Per step for N requests (what the runner calls, batched):

1. ``forward(None, positions, inputs_embeds)`` -> hidden; ``compute_logits(hidden of the
   last rows)`` -> codebook-0 logits; the engine samples code 0.
2. ``predict_residual_codes(hidden_last, code0)`` -> the frame's ``G`` codes.
3. ``frame_embedding(codes)`` = ``codec_embedding(code 0) + sum_g
   code_predictor.codec_embedding[g-1](code g)``: the next step's input, to which
   the engine adds that step's trailing text embedding (or ``tts_pad``).

The prompt side uses ``text_projection`` (thinker token embeddings at text
positions) and ``hidden_projection`` (thinker ``hidden_states[accept_hidden_layer]``
at audio/image/video positions), plus ``embed_tokens`` for codec ids (codebook 0 and specials).

Every talker layer is MoE with a shared expert: transformers'
``Qwen3OmniMoeTalkerDecoderLayer`` replaces the mlp it first builds from
``mlp_only_layers``/``decoder_sparse_step`` with the shared-expert block
unconditionally, and the checkpoint follows.

Module names mirror the checkpoint under ``talker.``.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch import nn

from omnistage.layers.linear import ResizeMLP
from omnistage.layers.quant.apply import apply_quantization
from omnistage.models.predictor_workspace import CodeSampler
from omnistage.models.qwen3_omni.code_predictor import CodePredictor
from omnistage.models.qwen3_omni.config import Qwen3OmniConfig
from omnistage.models.build import build_on
from omnistage.models.decoder import (
    Decoder,
    DecoderConfig,
    KVCacheSpec,
    decoder_config,
)
from omnistage.models.decoder_checkpoint import load_checkpoint

if TYPE_CHECKING:
    from transformers import PretrainedConfig

CHECKPOINT_PREFIX = "talker."


class TalkerModel(Decoder):
    def __init__(self, cfg: DecoderConfig, vocab_size: int) -> None:
        super().__init__(cfg)
        self.codec_embedding = nn.Embedding(vocab_size, cfg.hidden_size)


class Talker(nn.Module):
    uses_mrope = True  # positions are [3, T]

    def __init__(self, config: PretrainedConfig) -> None:
        """config: transformers' talker config (``Qwen3OmniMoeTalkerConfig``)."""
        super().__init__()
        self.config = config
        text = config.text_config
        self.num_code_groups = config.num_code_groups
        self.residual_vocab_size = config.code_predictor_config.vocab_size
        cfg = decoder_config(text, mrope=True, sparse_layers=[True] * text.num_hidden_layers)
        self.model = TalkerModel(cfg, text.vocab_size)
        mlp_args = (config.thinker_hidden_size, text.intermediate_size, text.hidden_size, text.hidden_act)
        self.text_projection = ResizeMLP(*mlp_args)
        self.hidden_projection = ResizeMLP(*mlp_args)
        self.codec_head = nn.Linear(text.hidden_size, text.vocab_size, bias=False)
        self.code_predictor = CodePredictor(config.code_predictor_config)
        if self.code_predictor.num_code_groups != self.num_code_groups:
            raise ValueError(
                f"talker num_code_groups={self.num_code_groups} but code predictor has "
                f"{self.code_predictor.num_code_groups}"
            )

    @classmethod
    def from_checkpoint(
        cls, folder: str | Path, device: torch.device | str = "cpu", dtype: torch.dtype = torch.bfloat16,
        quantization: str = "none", *, config: Qwen3OmniConfig | None = None,
    ) -> Talker:
        """``quantization``: ``int8`` quantizes the talker's and code predictor's decoder linears and experts as
        they are read (projections, heads and embeddings keep the model's precision). ``config``: the folder's
        parsed config (parsed here when not given)."""
        full = (config or Qwen3OmniConfig.from_folder(folder)).hf
        with build_on(device, dtype, empty=True):
            model = cls(full.talker_config)
        # Only the experts differ between the hub and runtime layouts of the talker.
        load_checkpoint(model, folder, CHECKPOINT_PREFIX, dtype, {}, quantization, device)
        apply_quantization(model, quantization)  # checks the name; every weight it would quantize already is
        return model.eval().requires_grad_(False)

    def kv_cache_spec(self) -> KVCacheSpec:
        return self.model.cfg.kv_cache_spec()

    # Inputs -------------------------------------------------------------------------------------
    def embed_tokens(self, ids: torch.Tensor) -> torch.Tensor:
        """Talker-vocabulary (codebook 0 and codec special) ids -> ``[..., H]``."""
        return self.model.codec_embedding(ids)

    def frame_embedding(self, codes: torch.Tensor) -> torch.Tensor:
        """codes ``[N, G]`` -> ``[N, H]``: the sum of every group's embedding of its code."""
        parts = [self.embed_tokens(codes[:, 0])]
        parts += [self.code_predictor.embed_code(g, codes[:, g]) for g in range(1, self.num_code_groups)]
        # Stacked then summed, the reference's reduction order.
        return torch.stack(parts, dim=1).sum(dim=1)

    # Forward ------------------------------------------------------------------------------------
    def forward(
        self, input_ids: torch.Tensor | None, positions: torch.Tensor, inputs_embeds: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Flattened batch -> final hidden ``[T, H]``; positions ``[3, T]``.

        The talker is fed embeddings (``inputs_embeds [T, H]``: prompt rows,
        then frame + trailing text); ``input_ids`` (codec ids) are embedded only
        when no embeddings are given. The argument order is the runner's
        ``ARModel`` contract, shared with the thinker.
        """
        if inputs_embeds is None:
            inputs_embeds = self.embed_tokens(input_ids)
        hidden, _ = self.model(inputs_embeds, positions)
        return hidden

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """``[N, H]`` -> codebook-0 logits ``[N, vocab]`` (suppressing specials is the sampler's job)."""
        return self.codec_head(hidden)

    def predict_residual_codes(
        self, hidden_last: torch.Tensor, code0: torch.Tensor, sampler: CodeSampler | None = None
    ) -> torch.Tensor:
        """hidden_last ``[N, H]`` (the rows code 0 was sampled from), code0 ``[N]`` -> codes ``[N, G]``.

        ``sampler`` picks each residual codebook's ids from its logits; greedy when None.
        """
        rest = self.code_predictor.predict(hidden_last, self.embed_tokens(code0), sampler)
        return torch.cat([code0[:, None].to(rest.dtype), rest], dim=1)
