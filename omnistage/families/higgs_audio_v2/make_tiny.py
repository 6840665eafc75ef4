"""``omnistage make-tiny --model-type higgs_audio_v2``: a random Higgs Audio v2 checkpoint in transformers' layout.

Writes config.json + model.safetensors (transformers' ``HiggsAudioV2ForConditionalGeneration`` under a fixed
seed, saved by transformers), tokenizer.json (the tiny byte-level BPE plus Llama 3's and Higgs's special tokens),
and audio_tokenizer/ (config.json, model.safetensors: the xcodec's tensors under transformers' names). ``tiny``
keeps the real timing (24 kHz, 960 samples a frame, 8 codebooks of 1024 codes) at small widths; ``--size full``
has the published shapes (Llama-3.2-3B with DualFFN, ~5.8 B parameters, and the published tokenizer's).

The tiny generator's heads are confident (``confident=True``, the served tiny): every codebook's embeddings are
scaled up and its head gains, for a fixed permutation ``succ_k``, a row for ``succ_k[c]`` along code ``c``'s
embedding, so greedy frames lead by several logits (a float-order difference cannot flip them) while the layers
still shape every logit. The stream EOS row is left random, so a random model speaks until its frame budget.
``confident=False`` leaves transformers' own initialisation (verify's plain case).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file

from omnistage.families.higgs_audio_v2.config import CODEC_FOLDER
from omnistage.tiny.cache import cached_build
from omnistage.tiny.tokenizer import train_tokenizer

SPECIALS = ("<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>",
            "<|audio_out_bos|>", "<|AUDIO_OUT|>", "<|audio_eos|>", "<|reserved_special_token_6|>",
            "<|scene_desc_start|>", "<|scene_desc_end|>", "<|AUDIO|>", "<|audio_bos|>")
BPE_SIZE = 512
EMBED_SCALE, HEAD_GAIN = 4.0, 24.0
CACHE_VERSION = 2  # 2: the checkpoint make-tiny writes since the tiny cache v1 was made (a stale v1 stays unused)
TINY = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 16, "max_position_embeddings": 4096}
TINY_CODEC = {
    "acoustic_model_config": {"encoder_hidden_size": 4, "decoder_hidden_size": 32, "hidden_size": 16,
                              "downsampling_ratios": [8, 5, 4, 2, 3], "upsampling_ratios": [8, 5, 4, 2, 3]},
    "semantic_model_config": {"hidden_size": 16, "num_hidden_layers": 1, "num_attention_heads": 2,
                              "intermediate_size": 32, "conv_dim": [8] * 7, "num_conv_pos_embeddings": 16,
                              "num_conv_pos_embedding_groups": 2, "mask_time_prob": 0.0},
    "codebook_dim": 8}
FULL_CODEC = {"acoustic_model_config": {"downsampling_ratios": [8, 5, 4, 2, 3], "upsampling_ratios": [8, 5, 4, 2, 3]},
              "codebook_dim": 64}


def make_tiny_higgs(out_dir: str | Path, seed: int = 0, size: str = "tiny", confident: bool = True) -> Path:
    from transformers import HiggsAudioV2Config, HiggsAudioV2ForConditionalGeneration

    out = Path(out_dir)
    (out / CODEC_FOLDER).mkdir(parents=True, exist_ok=True)
    tokenizer = train_tokenizer(BPE_SIZE)
    tokenizer.add_special_tokens(list(SPECIALS))
    tokenizer.save(str(out / "tokenizer.json"))
    ids = {t: tokenizer.token_to_id(t) for t in SPECIALS}
    shapes = TINY if size == "tiny" else {}
    config = HiggsAudioV2Config(
        **shapes, vocab_size=tokenizer.get_vocab_size() if size == "tiny" else 128256, codebook_size=1026,
        audio_token_id=ids["<|AUDIO_OUT|>"], audio_bos_token_id=ids["<|audio_out_bos|>"],
        audio_delay_token_id=ids["<|reserved_special_token_6|>"], eos_token_id=ids["<|eot_id|>"],
        bos_token_id=ids["<|begin_of_text|>"], pad_token_id=ids["<|end_of_text|>"])
    torch.manual_seed(seed)  # transformers' initialisation draws from the global generator
    with torch.device("meta" if size == "full" else "cpu"):
        model = HiggsAudioV2ForConditionalGeneration(config)
    if size == "full":  # ~5.8 B parameters: drawn in bf16 straight into their storage (no fp32 copy)
        model = model.to(torch.bfloat16).to_empty(device="cpu")
        fill_full_(model, seed, config.initializer_range)
    elif confident:
        confident_heads_(model, seed)
    model.save_pretrained(str(out))
    write_codec(out / CODEC_FOLDER, TINY_CODEC if size == "tiny" else FULL_CODEC, seed)
    return out


@torch.no_grad()
def fill_full_(model: torch.nn.Module, seed: int, std: float) -> None:
    """transformers' initialisation, in place: norms at one, every matrix normal with the config's deviation."""
    gen = torch.Generator().manual_seed(seed)
    for _, tensor in sorted(model.named_parameters()):
        if tensor.dim() == 1:
            tensor.fill_(1.0)
        else:
            tensor.copy_(torch.empty(tensor.shape).normal_(0.0, std, generator=gen))


@torch.no_grad()
def confident_heads_(model: torch.nn.Module, seed: int) -> None:
    cfg = model.config
    embed = model.model.embed_audio_tokens.embed_audio_tokens.weight
    embed.mul_(EMBED_SCALE)
    head = model.audio_lm_head.weight
    codes = cfg.audio_stream_bos_id  # the codec's own codes; the markers get no successor rows
    gen = torch.Generator().manual_seed(seed + 1)
    for k in range(cfg.num_codebooks):
        rows = embed[k * cfg.codebook_size:k * cfg.codebook_size + codes]
        succ = torch.randperm(codes, generator=gen) + k * cfg.codebook_size
        head[succ] += rows / rows.norm(dim=-1, keepdim=True).clamp_min(1e-6) * (HEAD_GAIN / cfg.hidden_size**0.5)


def write_codec(folder: Path, overrides: dict[str, object], seed: int) -> None:
    from transformers import HiggsAudioV2TokenizerConfig
    from transformers.models.xcodec.modeling_xcodec import SemanticDecoder

    from omnistage.families.higgs_audio_v2.codec import HiggsCodec

    config = HiggsAudioV2TokenizerConfig(**overrides, target_bandwidths=[0.5, 1, 1.5, 2])
    config.save_pretrained(str(folder))
    torch.manual_seed(seed + 2)
    codec = HiggsCodec(config)
    gen = torch.Generator().manual_seed(seed + 3)
    state = dict(codec.state_dict())
    for name, tensor in state.items():
        if name.endswith("codebook.embed"):  # a codebook of zeros decodes every code alike
            tensor.copy_(torch.randn(tensor.shape, generator=gen))
    state.update({f"decoder_semantic.{k}": v for k, v in SemanticDecoder(config).state_dict().items()})
    fc1 = torch.nn.Linear(config.hidden_size, config.semantic_model_config.hidden_size)
    state.update({f"fc1.{k}": v for k, v in fc1.state_dict().items()})
    save_file({n: t.detach().contiguous() for n, t in sorted(state.items())}, str(folder / "model.safetensors"),
              metadata={"format": "pt"})


def cached_checkpoint(name: str) -> Path:
    """``--model higgs-tiny``, made on first use."""
    return cached_build(f"{name}-v{CACHE_VERSION}-seed0", make_tiny_higgs, marker=f"{CODEC_FOLDER}/model.safetensors")


def make_tiny_command(args: argparse.Namespace) -> int:
    """``omnistage make-tiny --model-type higgs_audio_v2 [--size tiny|full] OUT``."""
    size = getattr(args, "size", "tiny") or "tiny"
    if size not in ("tiny", "full"):
        print("make-tiny --model-type higgs_audio_v2: --size is tiny or full", file=sys.stderr)
        return 2
    if getattr(args, "cached", False) and size == "tiny":
        print(cached_checkpoint("higgs-tiny"))
        return 0
    if args.out_dir is None:
        print("make-tiny --model-type higgs_audio_v2: give OUT_DIR (or --cached)", file=sys.stderr)
        return 2
    print(make_tiny_higgs(args.out_dir, seed=args.seed, size=size))
    return 0


