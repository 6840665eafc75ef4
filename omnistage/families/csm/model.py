"""CSM's generating model, named as transformers' ``CsmForConditionalGeneration`` names it (the codec apart).

A frame is 32 Mimi codes. The backbone reads the prompt (text embeddings; a context segment's audio frames as
the sum of their 32 codebook embeddings) and then one frame per step, and its ``lm_head`` picks the next
frame's codebook 0; the depth decoder, fed the backbone's last (normed) state and that code, picks codebooks
1..31 one after the other, each through its own head. An all-zero frame (``codebook_eos_token_id``) ends speech.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from omnistage.families.csm.config import CsmConfig
from omnistage.families.csm.llama import LlamaStack, LockstepCache

# Picks one id per row of ``[B, vocab]`` logits (each row its utterance's sampling), the codebook's index given.
Picker = Callable[[torch.Tensor, int], torch.Tensor]


class BackboneEmbeddings(nn.Module):
    def __init__(self, cfg: CsmConfig) -> None:
        super().__init__()
        self.embed_audio_tokens = nn.Embedding(cfg.num_codebooks * cfg.vocab_size, cfg.backbone.hidden_size)
        self.register_buffer("offsets", torch.arange(cfg.num_codebooks) * cfg.vocab_size, persistent=False)

    def forward(self, codes: torch.Tensor) -> torch.Tensor:
        """Frames ``[..., 32]`` -> the sum of their codebooks' embeddings ``[..., H]``."""
        return self.embed_audio_tokens(codes + self.offsets).sum(dim=-2)


class Backbone(LlamaStack):
    def __init__(self, cfg: CsmConfig) -> None:
        super().__init__(cfg.backbone)
        self.embed_tokens = BackboneEmbeddings(cfg)


class DepthModel(LlamaStack):
    def __init__(self, cfg: CsmConfig) -> None:
        super().__init__(cfg.depth)
        self.embed_tokens = nn.Embedding(cfg.num_codebooks * cfg.vocab_size, cfg.backbone.hidden_size)
        self.inputs_embeds_projector = nn.Linear(cfg.backbone.hidden_size, cfg.depth.hidden_size, bias=False)


class CodebooksHead(nn.Module):
    def __init__(self, cfg: CsmConfig) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(cfg.num_codebooks - 1, cfg.depth.hidden_size, cfg.vocab_size))


class DepthDecoder(nn.Module):
    def __init__(self, cfg: CsmConfig) -> None:
        super().__init__()
        self.model = DepthModel(cfg)
        self.codebooks_head = CodebooksHead(cfg)


class CsmModel(nn.Module):
    def __init__(self, cfg: CsmConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.embed_text_tokens = nn.Embedding(cfg.text_vocab_size, cfg.backbone.hidden_size)
        self.backbone_model = Backbone(cfg)
        self.lm_head = nn.Linear(cfg.backbone.hidden_size, cfg.vocab_size, bias=False)
        self.depth_decoder = DepthDecoder(cfg)
        if cfg.tie_codebooks_embeddings:  # one table, as the checkpoint stores it
            self.depth_decoder.model.embed_tokens.weight = self.backbone_model.embed_tokens.embed_audio_tokens.weight

    def prompt_embeds(self, input_ids: torch.Tensor, context: torch.Tensor | None) -> torch.Tensor:
        """``[T]`` ids -> ``[1, T, H]``: text embeddings, a context frame ``[n, 32]`` on each audio position in
        order, the all-EOS frame on each audio end."""
        cfg = self.cfg
        embeds = self.embed_text_tokens(input_ids)
        audio, ends = input_ids == cfg.audio_token_id, input_ids == cfg.audio_eos_token_id
        count = int(audio.sum())
        if count != (0 if context is None else context.shape[0]):
            raise ValueError(f"the prompt has {count} audio positions, its context "
                             f"{0 if context is None else context.shape[0]} frames")
        embeds = embeds.clone()
        if count:
            embeds[audio] = self.frame_embeds(context.to(input_ids.device)).to(embeds.dtype)
        if bool(ends.any()):
            eos = torch.full((1, cfg.num_codebooks), cfg.codebook_eos_token_id, device=input_ids.device)
            embeds[ends] = self.frame_embeds(eos).to(embeds.dtype)
        return embeds[None]

    def frame_embeds(self, codes: torch.Tensor) -> torch.Tensor:
        """Frames ``[B, 32]`` -> ``[B, H]`` (the next backbone step's inputs)."""
        return self.backbone_model.embed_tokens(codes)

    def first_codebook(self, hidden: torch.Tensor) -> torch.Tensor:
        """The backbone's normed states ``[B, H]`` -> codebook 0's logits ``[B, vocab]`` (float32)."""
        return self.lm_head(hidden).float()

    def depth_frames(self, hidden: torch.Tensor, first: torch.Tensor, pick: Picker) -> torch.Tensor:
        """Every utterance's codebooks 1..31 in lockstep: ``hidden`` ``[B, H]`` (the backbone's states) and
        ``first`` ``[B]`` (codebook 0) -> frames ``[B, 32]``."""
        depth, vocab = self.depth_decoder.model, self.cfg.vocab_size
        heads = self.depth_decoder.codebooks_head.weight
        cache, codes = LockstepCache(), [first]
        x = torch.stack([hidden, depth.embed_tokens(first).to(hidden.dtype)], dim=1)  # positions 0 and 1
        for book in range(1, self.cfg.num_codebooks):
            state = depth(depth.inputs_embeds_projector(x), cache)[:, -1]
            codes.append(pick((state @ heads[book - 1]).float(), book))
            x = depth.embed_tokens(codes[-1] + book * vocab)[:, None].to(hidden.dtype)
        return torch.stack(codes, dim=1)
