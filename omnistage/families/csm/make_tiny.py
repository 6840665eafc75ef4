"""``omnistage make-tiny --model-type csm``: a random CSM checkpoint in transformers' published layout.

Built with transformers' own ``CsmForConditionalGeneration`` and saved by its ``save_pretrained`` (config.json
with the depth decoder's and the Mimi codec's configs, model.safetensors with ``codec_model.``), plus a
``tokenizer.json`` (a byte-level BPE standing in for Llama 3's; the tiny's CSM markers follow it, the full size
keeps Llama 3's marker ids). ``--size full`` has the published shapes (~1.6 B parameters, bf16); ``tiny`` keeps
the real timing (32 codebooks, 12.5 Hz, 24 kHz) at small widths, the codec's attention window short so streamed
decoding crosses it, and each codebook as large as the codec's (64), so every code a random model picks decodes.
Weights are drawn so activations stay of order one, and the code heads are scaled so greedy picks have margins
float rounding cannot flip; the codec's codebooks and layer scales are drawn too (transformers starts them at
zero and 0.01) and its last conv scaled so the audio stays within [-1, 1]. ``--plain``: transformers' init alone.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
from torch import nn

from omnistage.families.csm.config import MODEL_TYPE
from omnistage.tiny.cache import cached_build
from omnistage.tiny.tokenizer import train_tokenizer

MARKERS = ("<|begin_of_text|>", "<|end_of_text|>", "<|AUDIO|>", "<|audio_eos|>")
BPE_SIZE = 512
HEAD_GAIN = 4.0  # code heads' logits spread wide: greedy picks keep margins
CACHE_VERSION = 1
LLAMA3_ROPE = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 32.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
SIZES: dict[str, dict[str, object]] = {
    "tiny": {
        "backbone": {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
                     "num_key_value_heads": 2, "vocab_size": 64, "codebook_pad_token_id": 63},
        "depth": {"hidden_size": 48, "intermediate_size": 96, "num_hidden_layers": 2, "num_attention_heads": 4,
                  "num_key_value_heads": 2, "backbone_hidden_size": 64, "vocab_size": 64},
        "codec": {"hidden_size": 32, "num_filters": 8, "codebook_size": 64, "codebook_dim": 16,
                  "vector_quantization_hidden_dimension": 16, "upsample_groups": 32, "num_hidden_layers": 1,
                  "intermediate_size": 64, "num_attention_heads": 2, "num_key_value_heads": 2, "sliding_window": 12},
    },
    "full": {"backbone": {}, "depth": {}, "codec": {}},  # transformers' defaults are the published shapes
}


def tiny_config(size: str, text_vocab: int) -> object:
    import transformers

    shapes = SIZES[size]
    markers = {"bos_token_id": text_vocab, "audio_token_id": text_vocab + 2, "audio_eos_token_id": text_vocab + 3,
               "pad_token_id": text_vocab + 2} if size == "tiny" else {}
    depth = {**shapes["depth"], "rope_parameters": LLAMA3_ROPE, "max_position_embeddings": 33}  # type: ignore[dict-item]
    codec = {**shapes["codec"], "num_quantizers": 32, "frame_rate": 12.5}  # type: ignore[dict-item]
    text = {"text_vocab_size": text_vocab + len(MARKERS)} if size == "tiny" else {}
    return transformers.CsmConfig(**shapes["backbone"], **markers, **text,  # type: ignore[arg-type]
                                  rope_parameters=LLAMA3_ROPE, depth_decoder_config=depth,
                                  codec_config=transformers.MimiConfig(**codec))


def make_tiny_csm(out_dir: str | Path, seed: int = 0, size: str = "tiny", plain: bool = False) -> Path:
    """``plain``: transformers' own random init (no wide heads, codebooks at zero): verify's case of weights
    this project did not shape."""
    import transformers

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = train_tokenizer(BPE_SIZE)
    text_vocab = tokenizer.get_vocab_size()
    if size == "tiny":  # the full size keeps Llama 3's marker ids (config.json's defaults) past the BPE's
        tokenizer.add_special_tokens(list(MARKERS))
    torch.manual_seed(seed)
    model = transformers.CsmForConditionalGeneration(tiny_config(size, text_vocab)).eval()
    if not plain:
        draw_weights(model, torch.Generator().manual_seed(seed))
    if size == "full":
        silence_codes_past_codec_(model)
        model = model.to(torch.bfloat16)
    tokenizer.save(str(out / "tokenizer.json"))
    model.save_pretrained(out)
    return out


@torch.no_grad()
def draw_weights(model: nn.Module, gen: torch.Generator) -> None:
    """Unit-gain linears and embeddings in the two Llama stacks, wide code heads, a live codec."""
    for name, tensor in sorted(model.state_dict(keep_vars=True).items()):
        if name.startswith("codec_model."):
            _draw_codec(name, tensor, gen)
        elif name.endswith("norm.weight"):
            tensor.normal_(1.0, 0.1, generator=gen)
        elif name.endswith("codebooks_head.weight"):
            tensor.normal_(0.0, HEAD_GAIN * tensor.shape[1] ** -0.5, generator=gen)
        elif name == "lm_head.weight":
            tensor.normal_(0.0, HEAD_GAIN * tensor.shape[1] ** -0.5, generator=gen)
        elif "embed" in name:
            tensor.normal_(0.0, 1.0 if "audio" not in name and "depth" not in name else 0.3, generator=gen)
        elif tensor.dim() == 2:
            tensor.normal_(0.0, tensor.shape[1] ** -0.5, generator=gen)
    last = model.codec_model.decoder.decoder_seanet.layers[-1].conv
    last.weight /= 8.0
    last.bias.zero_()


@torch.no_grad()
def silence_codes_past_codec_(model: nn.Module) -> None:
    """The full size's 2051 codes a codebook against the codec's 2048 entries: the code heads' rows for the ids
    past the codec (the published model's specials, which it never says in speech) are zeroed, so a random model's
    logit for them sits at the median and top-k sampling or greedy picks only codes the codec decodes."""
    entries = model.config.codec_config.codebook_size
    model.lm_head.weight[entries:] = 0.0
    model.depth_decoder.codebooks_head.weight[..., entries:] = 0.0


def _draw_codec(name: str, tensor: torch.Tensor, gen: torch.Generator) -> None:
    if name.endswith("embed_sum"):
        tensor.normal_(0.0, 1.0, generator=gen)
    elif name.endswith("cluster_usage"):
        tensor.uniform_(0.5, 2.0, generator=gen)
    elif name.endswith("scale"):
        tensor.normal_(0.0, 0.2, generator=gen)


def cached_checkpoint(name: str) -> Path:
    """``--model csm-tiny``, made on first use."""
    return cached_build(f"{name}-v{CACHE_VERSION}-seed0", make_tiny_csm)


def make_tiny_command(args: argparse.Namespace) -> int:
    """``omnistage make-tiny --model-type csm [--size tiny|full] OUT``."""
    size = getattr(args, "size", "tiny") or "tiny"
    if size not in SIZES:
        print(f"make-tiny --model-type {MODEL_TYPE}: --size is one of {sorted(SIZES)}", file=sys.stderr)
        return 2
    if getattr(args, "cached", False) and size == "tiny":
        print(cached_checkpoint("csm-tiny"))
        return 0
    if args.out_dir is None:
        print(f"make-tiny --model-type {MODEL_TYPE}: give OUT_DIR (or --cached)", file=sys.stderr)
        return 2
    print(make_tiny_csm(args.out_dir, seed=args.seed, size=size, plain=bool(getattr(args, "plain", False))))
    return 0
