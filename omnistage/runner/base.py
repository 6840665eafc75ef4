"""What a stage's model must offer its runner (the contract the model files implement).

Models read attention layout, KV caches and the backend from the forward
context (:mod:`omnistage.layers.attention.context`); the runner builds that
context, so these methods take only tensors.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch

from omnistage.models.predictor_workspace import CodeSampler


@runtime_checkable
class ARModel(Protocol):
    """An autoregressive stage (thinker, talker) over a flattened batch of ``T`` new tokens.

    forward: ``input_ids [T]``, ``positions [T]`` or ``[3, T]`` (M-RoPE),
        ``inputs_embeds [T, H]`` (when given, it replaces the ids' embeddings) → hidden ``[T, H]``.
    compute_logits: hidden ``[N, H]`` → ``[N, V]``.
    kv_cache_spec: ``(num_layers, num_kv_heads, head_dim)`` of its paged attention layers.
    embed_tokens: ids ``[T]`` → ``[T, H]``; the runner needs it to mix embedding
        prompts with id-fed rows in one batch.
    An optional attribute ``uses_mrope: bool`` says whether positions are ``[3, T]``.
    """

    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, inputs_embeds: torch.Tensor | None = None
    ) -> torch.Tensor: ...

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor: ...

    def kv_cache_spec(self) -> tuple[int, int, int]: ...

    def embed_tokens(self, input_ids: torch.Tensor) -> torch.Tensor: ...


@runtime_checkable
class TalkerModel(ARModel, Protocol):
    """The talker: codebook 0 from ``compute_logits``, the residual codebooks from its code predictor."""

    num_code_groups: int  # G: codebook 0 plus G - 1 residual codebooks
    residual_vocab_size: int  # ids per residual codebook

    def predict_residual_codes(
        self, hidden_last: torch.Tensor, code0: torch.Tensor, sampler: CodeSampler
    ) -> torch.Tensor:
        """hidden_last ``[N, H]``, code0 ``[N]`` → the whole frame's codes ``[N, G]`` (code0 first)."""
        ...

    def frame_embedding(self, codes: torch.Tensor) -> torch.Tensor:
        """codes ``[N, G]`` → ``[N, H]``, the summed embeddings of every codebook."""
        ...


@runtime_checkable
class Code2WavModel(Protocol):
    def decode_chunk(self, codes: torch.Tensor, left_context: int) -> torch.Tensor:
        """codes ``[B, G, T]`` → wav ``[B, (T - left_context) * samples_per_frame]``."""
        ...


def model_uses_mrope(model: object) -> bool:
    """The model's ``uses_mrope`` if it says; else whether any submodule is an M-RoPE rotary."""
    declared = getattr(model, "uses_mrope", None)
    if declared is not None:
        return bool(declared)
    modules = model.modules() if isinstance(model, torch.nn.Module) else ()
    return any(getattr(m, "mrope", None) is True for m in modules)
