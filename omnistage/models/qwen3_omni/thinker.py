"""The thinker: audio and vision encoders feeding a MoE text decoder that writes the text reply.

The audio and vision encoders are transformers' own ``Qwen3OmniMoeAudioEncoder``
and ``Qwen3OmniMoeVisionEncoder`` modules, used as sub-modules and filled from
our checkpoint reader (:func:`weights.load_module`): they run on whole items
(an audio, an image, a video), never on chunks, so they need no paged
attention. :meth:`Thinker.embed` encodes a prompt's items eagerly, batched per
modality; the engine path encodes them lazily through :meth:`encode_audios` /
:meth:`encode_visuals` (:mod:`prompt_media`), with the same rows. The text
decoder is ours (:mod:`decoder`) and reads attention from the forward context.

Module names mirror the checkpoint under ``thinker.``:
``model.language_model.*``, ``model.audio_tower.*``, ``model.visual.*``,
``lm_head``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch import nn

from omnistage.layers.parallel import UNSHARDED, TensorParallel
from omnistage.layers.quant.apply import apply_quantization
from omnistage.models.build import build_on
from omnistage.models.decoder import (
    Decoder,
    DecoderConfig,
    Deepstack,
    KVCacheSpec,
    decoder_config,
)
from omnistage.models.decoder_checkpoint import load_checkpoint
from omnistage.models.qwen3_omni.config import Qwen3OmniConfig
from omnistage.models.qwen3_audio_encoder import build_audio_encoder, encode_audios
from omnistage.models.qwen3_omni.mrope import MRopeTokens, mrope_positions
from omnistage.models.qwen3_omni.inputs import MultimodalInputs

if TYPE_CHECKING:
    from transformers import PretrainedConfig

CHECKPOINT_PREFIX = "thinker."
# Our name fragment -> the hub checkpoint's (transformers renames these on load).
HUB_NAMES = {"model.language_model.": "model.", "model.audio_tower.": "audio_tower.", "model.visual.": "visual."}


@dataclass
class ThinkerEmbeds:
    """A prompt's input embeddings ``[L, H]`` with encoder features merged in, and its deepstack part."""

    inputs_embeds: torch.Tensor
    deepstack: Deepstack | None = None


def thinker_decoder_config(text: PretrainedConfig) -> DecoderConfig:
    """MoE on layer i unless listed in mlp_only_layers or off the decoder_sparse_step grid."""
    sparse = [
        i not in (text.mlp_only_layers or []) and text.num_experts > 0 and (i + 1) % text.decoder_sparse_step == 0
        for i in range(text.num_hidden_layers)
    ]
    return decoder_config(text, mrope=True, sparse_layers=sparse)


class ThinkerTextModel(Decoder):
    def __init__(self, cfg: DecoderConfig, vocab_size: int, tp: TensorParallel = UNSHARDED) -> None:
        super().__init__(cfg, tp)
        self.embed_tokens = nn.Embedding(vocab_size, cfg.hidden_size)


class ThinkerModel(nn.Module):
    """Holds the three parts under the checkpoint's names (the text decoder as ``tp``'s rank's shards)."""

    def __init__(self, config: PretrainedConfig, tp: TensorParallel = UNSHARDED) -> None:
        super().__init__()
        from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import Qwen3OmniMoeVisionEncoder

        dtype = torch.get_default_dtype()
        self.audio_tower = build_audio_encoder(config.audio_config)
        self.visual = Qwen3OmniMoeVisionEncoder._from_config(config.vision_config, dtype=dtype)
        text = config.text_config
        self.language_model = ThinkerTextModel(thinker_decoder_config(text), text.vocab_size, tp)


class ThinkerDecoderShard(nn.Module):
    """What a tensor-parallel rank other than 0 holds of the thinker: its shards of the text decoder's layers,
    under the checkpoint's names (rank 0 alone embeds, encodes media and computes logits)."""

    def __init__(self, config: PretrainedConfig, tp: TensorParallel) -> None:
        super().__init__()
        self.model = nn.ModuleDict({"language_model": Decoder(thinker_decoder_config(config.text_config), tp)})


def load_decoder_shard(folder: str | Path, device: torch.device, dtype: torch.dtype, tp: TensorParallel,
                       quantization: str = "none") -> Decoder:
    """A rank's decoder shards (the ``loader`` of :class:`omnistage.runner.tp_executor.RankSpec`)."""
    full = Qwen3OmniConfig.from_folder(folder).hf
    with build_on(device, dtype, empty=True):
        shard = ThinkerDecoderShard(full.thinker_config, tp)
    load_checkpoint(shard, folder, CHECKPOINT_PREFIX, dtype, HUB_NAMES, quantization, device)
    apply_quantization(shard, quantization)  # checks the name; every weight it would quantize already is
    return shard.model["language_model"].eval().requires_grad_(False)


class Thinker(nn.Module):
    uses_mrope = True  # positions are [3, T]

    def __init__(self, config: PretrainedConfig, accept_hidden_layer: int, tp: TensorParallel = UNSHARDED) -> None:
        """config: transformers' thinker config; accept_hidden_layer: the talker's (0 = embeddings); tp: the
        tensor-parallel rank whose shards of the text decoder this instance holds (rank 0 holds all the rest)."""
        super().__init__()
        self.config = config
        text = config.text_config
        self.accept_hidden_layer = accept_hidden_layer
        self.model = ThinkerModel(config, tp)
        self.lm_head = nn.Linear(text.hidden_size, text.vocab_size, bias=False)
        if getattr(text, "tie_word_embeddings", False):
            self.lm_head.weight = self.model.language_model.embed_tokens.weight
        self.mrope_tokens = MRopeTokens.from_thinker_config(config)

    @classmethod
    def from_checkpoint(
        cls, folder: str | Path, device: torch.device | str = "cpu", dtype: torch.dtype = torch.bfloat16,
        tp: TensorParallel = UNSHARDED, quantization: str = "none", *, config: Qwen3OmniConfig | None = None,
    ) -> Thinker:
        """``quantization``: ``int8`` quantizes the decoder's linears and experts as they are read, so the full
        precision model is never held (an FP8 checkpoint is recognised from its config either way). ``config``:
        the folder's parsed config (parsed here when not given)."""
        full = (config or Qwen3OmniConfig.from_folder(folder)).hf
        with build_on(device, dtype, empty=True):
            model = cls(full.thinker_config, full.talker_config.accept_hidden_layer, tp)
        load_checkpoint(model, folder, CHECKPOINT_PREFIX, dtype, HUB_NAMES, quantization, device)
        apply_quantization(model, quantization)  # checks the name; every weight it would quantize already is
        return model.eval().requires_grad_(False)

    # Shapes -------------------------------------------------------------------------------------
    @property
    def decoder(self) -> ThinkerTextModel:
        return self.model.language_model

    def kv_cache_spec(self) -> KVCacheSpec:
        return self.decoder.kv_cache_spec()

    # Inputs -------------------------------------------------------------------------------------
    def embed_tokens(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Plain token embeddings ``[T, H]`` (what the talker projects at text positions)."""
        return self.decoder.embed_tokens(input_ids)

    def positions(self, input_ids: torch.Tensor, mm: MultimodalInputs | None = None) -> tuple[torch.Tensor, int]:
        """M-RoPE positions ``[3, L]`` of a prompt and the delta for its decode positions."""
        mm = mm or MultimodalInputs()
        return mrope_positions(
            input_ids, self.mrope_tokens, mm.image_grid_thw, mm.video_grid_thw, mm.audio_lengths(),
            mm.video_second_per_grid,
        )

    @torch.no_grad()
    def embed(self, input_ids: torch.Tensor, mm: MultimodalInputs | None = None) -> ThinkerEmbeds:
        """Embeddings of one prompt ``[L]`` with audio/image/video features at their placeholder rows."""
        embeds = self.embed_tokens(input_ids)
        if mm is None:
            return ThinkerEmbeds(embeds)
        if mm.input_features is not None:
            embeds = self._merge(embeds, input_ids, self.config.audio_token_id, self._audio_features(mm))
        visual: list[tuple[torch.Tensor, list[torch.Tensor]]] = []
        for pixels, grid, token in (
            (mm.pixel_values, mm.image_grid_thw, self.config.image_token_id),
            (mm.pixel_values_videos, mm.video_grid_thw, self.config.video_token_id),
        ):
            if pixels is not None:
                pooled, deepstack = self._visual_features(pixels, grid)
                embeds = self._merge(embeds, input_ids, token, pooled)
                visual.append((input_ids == token, deepstack))
        return ThinkerEmbeds(embeds, _deepstack(visual))

    def _visual_features(self, pixels: torch.Tensor, grid: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """Merged patch features ``[tokens, H]`` and one deepstack feature per deepstack layer."""
        tower = self.model.visual
        out = tower(pixels.to(tower.device, tower.dtype), grid_thw=grid.to(tower.device))
        return out.pooler_output, list(out.deepstack_features)

    def _audio_features(self, mm: MultimodalInputs) -> torch.Tensor:
        tower = self.model.audio_tower
        mask = mm.feature_attention_mask.to(tower.device).bool()
        # [A, mel, frames] -> [mel, valid frames of all audios], the encoder's packed layout.
        features = mm.input_features.to(tower.device, tower.dtype).permute(0, 2, 1)[mask].permute(1, 0)
        out = tower(features, feature_lens=mask.sum(-1))
        return out.last_hidden_state

    @torch.no_grad()
    def encode_audios(self, mels: list[torch.Tensor]) -> list[torch.Tensor]:
        """Features ``[tokens_i, H]`` of each audio given as its valid mel frames ``[mel, frames_i]``: one encoder
        call over all of them, in :meth:`embed`'s packed layout (an audio's rows depend on it alone)."""
        return encode_audios(self.model.audio_tower, mels, self.mrope_tokens.audio_n_window)

    @torch.no_grad()
    def encode_visuals(
        self, pixels: list[torch.Tensor], grids: list[torch.Tensor]
    ) -> list[tuple[torch.Tensor, list[torch.Tensor]]]:
        """(merged features ``[tokens_i, H]``, deepstack features per layer) of each image or video
        (``pixels[i]`` its patches, ``grids[i]`` its ``[3]`` grid): one encoder call over all of them."""
        pooled, deepstack = self._visual_features(torch.cat(pixels), torch.stack(grids))
        counts = [int(g.prod()) // self.mrope_tokens.spatial_merge_size**2 for g in grids]
        layers = [d.split(counts) for d in deepstack]
        return [(p, [layer[i] for layer in layers]) for i, p in enumerate(pooled.split(counts))]

    @staticmethod
    def _merge(embeds: torch.Tensor, input_ids: torch.Tensor, token: int, features: torch.Tensor) -> torch.Tensor:
        rows = (input_ids == token).nonzero().squeeze(1)
        if rows.numel() != features.shape[0]:
            raise ValueError(f"prompt has {rows.numel()} placeholder tokens {token} but {features.shape[0]} features")
        embeds = embeds.clone()
        embeds[rows] = features.to(embeds.dtype)
        return embeds

    # Forward ------------------------------------------------------------------------------------
    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        inputs_embeds: torch.Tensor | None = None,
        deepstack: Deepstack | None = None,
    ) -> torch.Tensor:
        """Flattened batch: ids ``[T]``, positions ``[3, T]`` -> final hidden ``[T, H]``."""
        hidden, _ = self._run(input_ids, positions, inputs_embeds, deepstack, capture_layer=None)
        return hidden

    def forward_with_accept_hidden(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        inputs_embeds: torch.Tensor | None = None,
        deepstack: Deepstack | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """As :meth:`forward`, plus transformers' ``hidden_states[accept_hidden_layer]`` ``[T, H]`` for the talker."""
        hidden, accept = self._run(input_ids, positions, inputs_embeds, deepstack, self.accept_hidden_layer)
        return hidden, accept

    def _run(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        inputs_embeds: torch.Tensor | None,
        deepstack: Deepstack | None,
        capture_layer: int | None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        if inputs_embeds is None:
            inputs_embeds = self.embed_tokens(input_ids)
        return self.decoder(inputs_embeds, positions, deepstack, capture_layer)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """``[N, H]`` (the rows to sample from) -> ``[N, vocab]``."""
        return self.lm_head(hidden)


def _deepstack(visual: list[tuple[torch.Tensor, list[torch.Tensor]]]) -> Deepstack | None:
    """Joins image and video deepstack features row-aligned over the union of their rows."""
    if not visual or not visual[0][1]:
        return None
    masks = [mask for mask, _ in visual]
    union = torch.stack(masks).any(0)
    rows = union.nonzero().squeeze(1)
    num_layers = len(visual[0][1])
    ref = visual[0][1][0]
    features = ref.new_zeros(num_layers, rows.numel(), ref.shape[-1])
    for mask, layers in visual:
        where = mask[union]  # which of the union rows are this modality's
        for i, feat in enumerate(layers):
            features[i, where] = feat.to(features.dtype)
    return Deepstack(rows, features)
