"""``omnistage make-tiny --model-type qwen3_tts``: a random Qwen3-TTS checkpoint in the Hugging Face layout.

Writes config.json, generation_config.json, model.safetensors, the offline BPE tokenizer, and speech_tokenizer/
(config.json, preprocessor_config.json, model.safetensors): what ``qwen_tts``'s ``Qwen3TTSModel.from_pretrained``
loads. Weights are drawn from omnistage's own modules under a fixed seed (no reference code needed) and saved
with sorted names, so one seed always gives byte-identical files. Sizes:
:mod:`omnistage.families.qwen3_tts.checkpoint_config` (``full`` is the
real 0.6B's every shape: ~0.9 B parameters in model.safetensors, ~2.5 GB on disk with the codec).

Drawn so that tests test something: greedy codes must not flip under float noise, so the heads are wide
(logit gaps far above rounding error); codec EOS gets a zero head row, so a random talker speaks until
``max_tokens`` rather than stopping at once; the codec's convolutions are fan-in scaled, so the waveform is of
order 0.01-0.1 and a 1e-4 bound on it is not trivially met.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file
from torch import nn

from omnistage.families.qwen3_tts.checkpoint_config import (FEATURE_EXTRACTOR, GENERATION_CONFIG, TINY, TTS_SIZES,
                                                            TTSSize, model_config, speech_tokenizer_config)
from omnistage.models.qwen3_tts.checkpoint import Qwen3TTSModels
from omnistage.models.qwen3_tts.config import TOKENIZER_FOLDER, Qwen3TTSConfig
from omnistage.tiny.cache import cached_build
from omnistage.tiny.chat_template import QWEN3_OMNI_CHAT_TEMPLATE
from omnistage.tiny.tokenizer import save_tokenizer

BPE_SIZE = 960
HEAD_STD = 0.5  # codec_head and the code predictor's heads: logit gaps of order 1


def make_tiny_tts(out_dir: str | Path, seed: int = 0, size: TTSSize = TINY,
                  tts_model_type: str = "custom_voice") -> Path:
    """Writes a random Qwen3-TTS checkpoint of ``size`` and type into ``out_dir`` (existing files replaced)."""
    out = Path(out_dir)
    (out / TOKENIZER_FOLDER).mkdir(parents=True, exist_ok=True)
    layout = save_tokenizer(out, BPE_SIZE, QWEN3_OMNI_CHAT_TEMPLATE)
    raw, tokenizer_raw = model_config(size, layout, tts_model_type), speech_tokenizer_config(size)
    _write_json(out / "config.json", raw)
    _write_json(out / "generation_config.json", GENERATION_CONFIG)
    _write_json(out / TOKENIZER_FOLDER / "config.json", tokenizer_raw)
    _write_json(out / TOKENIZER_FOLDER / "preprocessor_config.json", FEATURE_EXTRACTOR)
    models = Qwen3TTSModels.build(Qwen3TTSConfig.from_dicts(raw, tokenizer_raw), out)
    draw_weights(models, seed)
    main, codec = models.state_dicts()
    _save(main, out / "model.safetensors", getattr(torch, size.weight_dtype))
    _save(codec, out / TOKENIZER_FOLDER / "model.safetensors", torch.float32)
    return out


# --model names of the embedded checkpoints: tts-{size}[-{type}] (CustomVoice when no type is named).
TYPE_SUFFIXES = {"": "custom_voice", "-design": "voice_design", "-base": "base"}
CACHED_NAMES = tuple(f"tts-{size}{suffix}" for size in TTS_SIZES for suffix in TYPE_SUFFIXES)
CACHE_VERSION = 1


def cached_checkpoint(name: str) -> Path:
    """Qwen3-TTS's ``cached`` hook: ``tts-tiny``, ``tts-medium-base``... made on first use under the cache folder
    (built aside and renamed into place, so a crash or a concurrent builder never leaves half a checkpoint)."""
    size, _, kind = name.removeprefix("tts-").partition("-")
    tts_model_type = TYPE_SUFFIXES[f"-{kind}" if kind else ""]
    return cached_build(f"{name}-v{CACHE_VERSION}-seed0",
                        lambda out: make_tiny_tts(out, size=TTS_SIZES[size], tts_model_type=tts_model_type),
                        marker=f"{TOKENIZER_FOLDER}/model.safetensors")


def make_tiny_command(args: argparse.Namespace) -> int:
    """Qwen3-TTS's ``make_tiny`` hook: ``omnistage make-tiny --model-type qwen3_tts [--tts-model-type T] OUT``."""
    if getattr(args, "fp8", False):
        print("make-tiny --fp8 writes a Qwen3-Omni thinker in FP8; Qwen3-TTS has no FP8 variant", file=sys.stderr)
        return 2
    if args.cached and args.size in TTS_SIZES:
        suffix = {v: k for k, v in TYPE_SUFFIXES.items()}[args.tts_model_type]
        print(cached_checkpoint(f"tts-{args.size}{suffix}"))
        return 0
    if args.out_dir is None or args.size not in TTS_SIZES:
        print(f"make-tiny --model-type qwen3_tts: give OUT_DIR (or --cached) and a --size of {sorted(TTS_SIZES)}",
              file=sys.stderr)
        return 2
    print(make_tiny_tts(args.out_dir, seed=args.seed, size=TTS_SIZES[args.size], tts_model_type=args.tts_model_type))
    return 0


def _write_json(path: Path, value: object) -> None:
    path.write_text(json.dumps(value, indent=2, sort_keys=True) + "\n")


def _save(state: dict[str, torch.Tensor], path: Path, dtype: torch.dtype) -> None:
    """Floating tensors in ``dtype`` (drawn in fp32; the full sizes store bf16, as the real checkpoints do)."""
    tensors = {name: (t.detach().to(dtype) if t.is_floating_point() else t.detach()).contiguous()
               for name, t in sorted(state.items())}
    save_file(tensors, str(path), metadata={"format": "pt"})


@torch.no_grad()
def draw_weights(models: Qwen3TTSModels, seed: int) -> None:
    """Every tensor from one seeded generator, in module order (so the draw does not depend on the allocator)."""
    gen = torch.Generator().manual_seed(seed)
    for module in models.modules():
        for name, tensor in module.state_dict(keep_vars=True).items():
            _draw(module, name, tensor, gen)
    talker = models.talker
    for head in [talker.codec_head, *talker.code_predictor.lm_head]:
        head.weight.normal_(0.0, HEAD_STD, generator=gen)
    talker.codec_head.weight[talker.config.codec.eos] = 0.0


def _draw(module: nn.Module, name: str, tensor: torch.Tensor, gen: torch.Generator) -> None:
    path, _, leaf = name.rpartition(".")
    owner = module.get_submodule(path) if path else module
    if not tensor.is_floating_point():
        return
    if leaf in ("cluster_usage", "initialized") or (leaf == "weight" and tensor.dim() == 1):
        tensor.fill_(1.0)  # codebook usage counts; RMSNorm and LayerNorm scales
    elif leaf in ("scale", "gamma"):
        tensor.fill_(0.01 if leaf == "scale" else 0.1)  # layer scales, ConvNeXt gains
    elif leaf in ("alpha", "beta"):
        tensor.zero_()  # SnakeBeta's log-scale parameters: exp(0) = 1
    elif leaf == "bias":
        tensor.normal_(0.0, 0.02, generator=gen)
    elif leaf in ("embedding_sum", "embed_sum") or isinstance(owner, nn.Embedding):
        tensor.normal_(0.0, 1.0, generator=gen)
    elif isinstance(owner, (nn.Conv1d, nn.ConvTranspose1d)):
        fan_in = tensor.shape[1] * tensor.shape[2]
        if isinstance(owner, nn.ConvTranspose1d):
            fan_in = tensor.shape[0] * tensor.shape[2] // owner.stride[0]
        tensor.normal_(0.0, 0.6 * fan_in**-0.5, generator=gen)
    else:  # linears: unit-scale activations at tiny widths, the reference's 0.02 at wide ones
        tensor.normal_(0.0, 0.02 if tensor.shape[-1] > 64 else tensor.shape[-1] ** -0.5, generator=gen)
