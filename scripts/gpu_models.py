"""The stages scripts/gpu_check.py measures, built in memory from random weights directly on the device: no
checkpoint is written or read, and one process builds each stage once.

* thinker: the Qwen3-Omni-30B-A3B text decoder (hidden 2048, 128 experts top-8 of 768, GQA 32/4 heads of 128,
  vocabulary 152064) with its LM head, ``layers`` deep (48 is the real depth: ~61 GB in bf16);
* talker: the real talker (hidden 1024, 128 experts top-6 of 384 plus a shared expert, 16/2 heads) with its
  5-layer code predictor, from the ``slice`` checkpoint size's widths, ``layers`` deep (20 is the real depth).
At toy sizes (``--cpu``) both come from the ``tiny`` checkpoint size.
"""

from __future__ import annotations

import dataclasses

import torch
from torch import nn

from omnistage.engine import Request, SamplingParams
from omnistage.models.build import build_on
from omnistage.models.decoder import DecoderConfig, MoeConfig
from omnistage.models.qwen3_omni.thinker import ThinkerTextModel
from omnistage.runner import StepHook
from omnistage.tools.bench.engine import StageUnderTest

REAL_THINKER = dict(hidden_size=2048, num_layers=48, num_heads=32, num_kv_heads=4, head_dim=128,
                    intermediate_size=768, experts=128, top_k=8, moe_intermediate=768, vocab=152064)
TINY_THINKER = dict(hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16, intermediate_size=64,
                    experts=8, top_k=2, moe_intermediate=32, vocab=512)
REAL_TALKER_LAYERS = 20


def decoder_cfg(s: dict) -> DecoderConfig:
    return DecoderConfig(
        hidden_size=s["hidden_size"], num_layers=s["num_layers"], num_heads=s["num_heads"],
        num_kv_heads=s["num_kv_heads"], head_dim=s["head_dim"], intermediate_size=s["intermediate_size"],
        rms_norm_eps=1e-6, rope_theta=1e6, mrope_section=None,
        moe=MoeConfig(s["experts"], s["top_k"], s["moe_intermediate"], norm_topk_prob=True),
        sparse_layers=(True,) * s["num_layers"],
    )


class TextLM(nn.Module):
    """The thinker's text decoder + LM head as an ``ARModel`` (1-D RoPE: text-only decode)."""

    uses_mrope = False

    def __init__(self, cfg: DecoderConfig, vocab: int) -> None:
        super().__init__()
        self.cfg = cfg
        self.decoder = ThinkerTextModel(cfg, vocab)
        self.lm_head = nn.Linear(cfg.hidden_size, vocab, bias=False)

    def embed_tokens(self, ids: torch.Tensor) -> torch.Tensor:
        return self.decoder.embed_tokens(ids)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                inputs_embeds: torch.Tensor | None = None) -> torch.Tensor:
        embeds = self.embed_tokens(input_ids) if inputs_embeds is None else inputs_embeds
        return self.decoder(embeds, positions)[0]

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden)

    def kv_cache_spec(self) -> tuple[int, int, int]:
        return tuple(self.cfg.kv_cache_spec())


@torch.no_grad()
def randomize(model: nn.Module, seed: int = 0) -> nn.Module:
    """Draws every weight on its device (fused experts may be torch.empty); norms and biases get 1 / 0."""
    gen = torch.Generator(device=next(model.parameters()).device).manual_seed(seed)
    for name, p in model.named_parameters():
        if p.dim() >= 2:
            p.normal_(0.0, 0.02, generator=gen)
        else:
            p.fill_(0.0 if name.endswith("bias") else 1.0)
    return model.eval().requires_grad_(False)


def build_thinker(sizes: dict, device: str, dtype: torch.dtype) -> TextLM:
    with build_on(device, dtype):
        model = TextLM(decoder_cfg(sizes), sizes["vocab"])
    return randomize(model)


def thinker_stage(model: TextLM, vocab: int) -> StageUnderTest:
    def request(rid: str, n: int, params: SamplingParams, gen: torch.Generator) -> Request:
        return Request(rid, torch.randint(0, vocab, (n,), generator=gen).tolist(), params)

    return StageUnderTest(model, StepHook, request)


def talker_config(real: bool, layers: int | None):
    """transformers' talker config at the ``slice`` widths (real) or the ``tiny`` ones, ``layers`` deep."""
    from omnistage.models.qwen3_omni.config import Qwen3OmniConfig
    from omnistage.families.qwen3_omni.checkpoint_config import checkpoint_config_dict
    from omnistage.families.qwen3_omni.checkpoint_sizes import SIZES
    from omnistage.families.qwen3_omni.make_tiny import BPE_SIZE
    from omnistage.tiny.tokenizer import SPECIAL_TOKENS, TokenizerLayout

    size = SIZES["slice" if real else "tiny"]
    if layers:
        size = dataclasses.replace(size, talker=dataclasses.replace(size.talker, layers=layers))
    layout = TokenizerLayout(BPE_SIZE, BPE_SIZE + len(SPECIAL_TOKENS))
    raw = checkpoint_config_dict(layout, {"system": 1, "user": 2, "assistant": 3}, size)
    return Qwen3OmniConfig.from_dict(raw).hf.talker_config


def build_talker(real: bool, layers: int | None, device: str, dtype: torch.dtype):  # -> Talker
    from omnistage.models.qwen3_omni.talker import Talker

    config = talker_config(real, layers)
    with build_on(device, dtype):
        model = Talker(config)
    return randomize(model)


def talker_stage(model, device: str, dtype: torch.dtype) -> StageUnderTest:  # model: Talker
    from omnistage.runner.talker_hook import TalkerRequestData, TalkerStepHook, talker_suppress_mask

    text = model.config.text_config
    mask = talker_suppress_mask(text.vocab_size, model.config.codec_eos_token_id, device)

    def request(rid: str, n: int, params: SamplingParams, gen: torch.Generator) -> Request:
        data = TalkerRequestData(tts_pad_embed=torch.zeros(text.hidden_size, dtype=dtype, device=device),
                                 text_finished=True)
        embeds = (torch.randn(n, text.hidden_size, generator=gen) * 0.1).to(device, dtype)
        return Request(rid, None, params, prompt_embeds=embeds, stage_data=data)

    return StageUnderTest(model, lambda: TalkerStepHook(model, mask), request)


def param_bytes(model: nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())
