"""Qwen3-TTS's talker: a dense Qwen3 decoder that speaks one 12 Hz codec frame per step.

Per step for N requests (what the AR runner calls, batched; :class:`omnistage.runner.TalkerStepHook` drives it):

1. ``forward(None, positions, inputs_embeds)`` -> hidden; ``compute_logits`` -> codebook-0 logits
   (``codec_head``); the engine samples code 0 (ids in the top 1024 suppressed except codec EOS).
2. ``predict_residual_codes(hidden_last, code0, sampler)`` -> the frame's ``G`` codes (the code predictor).
3. ``frame_embedding(codes)`` = ``codec_embedding(code 0) + sum_g code_predictor.codec_embedding[g-1](code g)``:
   the next input, to which the hook adds that step's trailing text (or ``tts_pad``).

Prompts are built by :mod:`omnistage.models.qwen3_tts.prompt` from ``text_embedding`` (the model's own copy of
the text vocabulary, ``text_hidden_size`` wide) through ``text_projection`` and from ``codec_embedding``.

The reference's attention is M-RoPE (interleaved sections), but a TTS prompt is text only: every token gets the
same position on all three axes, which rotates exactly as plain 1-D RoPE at that position. Positions are
``0..L-1`` over the prompt and continue one per frame. Module names mirror the checkpoint under ``talker.``.
"""

from __future__ import annotations

import torch
from torch import nn

from omnistage.layers.linear import ResizeMLP
from omnistage.models.predictor_workspace import CodeSampler
from omnistage.models.decoder import Decoder, KVCacheSpec
from omnistage.models.qwen3_tts.code_predictor import CodePredictor
from omnistage.models.qwen3_tts.config import TalkerConfig

CHECKPOINT_PREFIX = "talker."


class TalkerStack(Decoder):
    def __init__(self, config: TalkerConfig) -> None:
        super().__init__(config.stack)
        self.codec_embedding = nn.Embedding(config.vocab_size, config.stack.hidden_size)
        self.text_embedding = nn.Embedding(config.text_vocab_size, config.text_hidden_size)


class Qwen3TTSTalker(nn.Module):
    """Meets :class:`omnistage.runner.base.TalkerModel`; built from a :class:`TalkerConfig`."""

    uses_mrope = False  # see the module docstring: equal M-RoPE axes are 1-D RoPE

    def __init__(self, config: TalkerConfig) -> None:
        super().__init__()
        if config.code_predictor.num_code_groups != config.num_code_groups:
            raise ValueError(f"talker num_code_groups={config.num_code_groups} but the code predictor has "
                             f"{config.code_predictor.num_code_groups}")
        self.config = config
        hidden = config.stack.hidden_size
        self.num_code_groups = config.num_code_groups
        self.residual_vocab_size = config.code_predictor.vocab_size
        self.model = TalkerStack(config)
        self.text_projection = ResizeMLP(config.text_hidden_size, config.text_hidden_size, hidden,
                                              config.stack.hidden_act)
        self.codec_head = nn.Linear(hidden, config.vocab_size, bias=False)
        self.code_predictor = CodePredictor(config.code_predictor, hidden)

    def kv_cache_spec(self) -> KVCacheSpec:
        return self.model.cfg.kv_cache_spec()

    # Inputs -------------------------------------------------------------------------------------
    def embed_tokens(self, ids: torch.Tensor) -> torch.Tensor:
        """Talker-vocabulary ids (codebook 0, codec specials, languages, speakers) -> ``[..., H]``."""
        return self.model.codec_embedding(ids)

    def embed_text(self, text_ids: torch.Tensor) -> torch.Tensor:
        """Text-vocabulary ids -> projected ``[..., H]``, the text track of a prompt."""
        return self.text_projection(self.model.text_embedding(text_ids))

    def frame_embedding(self, codes: torch.Tensor) -> torch.Tensor:
        """codes ``[N, G]`` -> ``[N, H]``: every group's embedding of its code, stacked then summed as the reference."""
        parts = [self.embed_tokens(codes[:, 0])]
        parts += [self.code_predictor.embed_code(g, codes[:, g]) for g in range(1, self.num_code_groups)]
        return torch.stack(parts, dim=1).sum(dim=1)

    # Forward ------------------------------------------------------------------------------------
    def forward(self, input_ids: torch.Tensor | None, positions: torch.Tensor,
                inputs_embeds: torch.Tensor | None = None) -> torch.Tensor:
        """Flattened batch -> final hidden ``[T, H]``; positions ``[T]``. Fed embeddings (prompt rows, then frame +
        trailing text); ``input_ids`` (codec ids) are embedded only when no embeddings are given."""
        if inputs_embeds is None:
            inputs_embeds = self.embed_tokens(input_ids)
        hidden, _ = self.model(inputs_embeds, positions)
        return hidden

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """``[N, H]`` -> codebook-0 logits ``[N, vocab]`` (suppressing specials is the step hook's job)."""
        return self.codec_head(hidden)

    def predict_residual_codes(self, hidden_last: torch.Tensor, code0: torch.Tensor,
                               sampler: CodeSampler | None = None) -> torch.Tensor:
        """hidden_last ``[N, H]``, code0 ``[N]`` -> codes ``[N, G]``; greedy residuals when ``sampler`` is None."""
        rest = self.code_predictor.predict(hidden_last, self.embed_tokens(code0), sampler)
        return torch.cat([code0[:, None].to(rest.dtype), rest], dim=1)
