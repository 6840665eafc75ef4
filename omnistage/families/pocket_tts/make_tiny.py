"""``omnistage make-tiny --model-type pocket_tts``: a random Pocket TTS checkpoint in transformers' layout.

Writes config.json, model.safetensors, voices/ (two built-in voices' latents),
tokenizer.json (a byte-level BPE standing in for the SentencePiece
model; the text ids stay below the four audio placeholders), and audio_tokenizer/ (config.json,
model.safetensors). ``--size full`` has the published shapes (~100 M parameters with the codec decoder); ``tiny``
keeps the real timing (24 kHz, 1920 samples a frame) at small widths, with a short attention window so streamed
decoding crosses it. Weights come from omnistage's own modules under a fixed seed, scaled so activations stay of
order one (a 1e-5 parity bound is then not met trivially); the EOS head's bias is very negative, so a random
model speaks until its frame budget (a test that wants it to stop sets the bias).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file
from torch import nn

from omnistage.families.pocket_tts.backbone import PocketTTS
from omnistage.families.pocket_tts.codec import LatentDecoder
from omnistage.families.pocket_tts.codec_encoder import VoiceEncoder
from omnistage.families.pocket_tts.config import CODEC_FOLDER, CODEC_MODEL_TYPE, MODEL_TYPE, PocketCheckpoint
from omnistage.families.pocket_tts.voices import VOICES_FOLDER, write_latents
from omnistage.tiny.cache import cached_build
from omnistage.tiny.tokenizer import train_tokenizer

SIZES: dict[str, tuple[dict[str, object], dict[str, object]]] = {
    "tiny": ({"vocab_size": 1004, "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
              "intermediate_size": 128, "audio_prompt_token_id": 1000, "audio_latent_token_id": 1001,
              "audio_prompt_bos_token_id": 1002, "audio_bos_token_id": 1003,
              "flow_head_config": {"hidden_size": 48, "num_hidden_layers": 2, "condition_dim": 64}},
             {"hidden_size": 32, "num_filters": 8, "upsample_groups": 32, "num_hidden_layers": 1,
              "intermediate_size": 64, "num_attention_heads": 2, "num_key_value_heads": 2,
              "sliding_window": 12}),
    "full": ({}, {}),  # transformers' defaults are the published shapes
}
BPE_SIZE = 512
EOS_BIAS = -30.0
LINEAR_GAIN = 0.6
CACHE_VERSION = 2
BUILTIN_VOICES = ("alba", "marius")
VOICE_FRAMES = 6


def configs(size: str, flow_type: str = "lsd") -> tuple[dict[str, object], dict[str, object]]:
    model, codec = SIZES[size]
    flow = {**model.get("flow_head_config", {}), "flow_type": flow_type}  # type: ignore[dict-item]
    model = {**model, "model_type": MODEL_TYPE, "flow_head_config": flow,
             "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}}
    codec = {**codec, "model_type": CODEC_MODEL_TYPE, "rope_parameters": {"rope_type": "default",
                                                                            "rope_theta": 10000.0}}
    return model, codec


def make_tiny_pocket(out_dir: str | Path, seed: int = 0, size: str = "tiny", flow_type: str = "lsd") -> Path:
    out = Path(out_dir)
    (out / CODEC_FOLDER).mkdir(parents=True, exist_ok=True)
    model_raw, codec_raw = configs(size, flow_type)
    _write_json(out / "config.json", model_raw)
    _write_json(out / CODEC_FOLDER / "config.json", codec_raw)
    train_tokenizer(BPE_SIZE).save(str(out / "tokenizer.json"))
    ckpt = PocketCheckpoint.from_folder(out)
    gen = torch.Generator().manual_seed(seed)
    model, decoder, encoder = PocketTTS(ckpt.model), LatentDecoder(ckpt.codec), VoiceEncoder(ckpt.codec)
    for module in (model, decoder, encoder):
        draw_weights(module, gen)
    with torch.no_grad():
        model.eos_head.bias.fill_(EOS_BIAS)
        model.latent_std.uniform_(0.5, 1.5, generator=gen)
        model.latent_mean.normal_(0.0, 0.1, generator=gen)
    _save(model.state_dict(), out / "model.safetensors")
    _save({**decoder.state_dict(), **encoder.state_dict()}, out / CODEC_FOLDER / "model.safetensors")
    (out / VOICES_FOLDER).mkdir(exist_ok=True)
    for name in BUILTIN_VOICES:  # the reference's catalogue names, random latents
        write_latents(torch.randn(VOICE_FRAMES, ckpt.model.latent_dim, generator=gen), out / VOICES_FOLDER /
                      f"{name}.safetensors")
    return out


@torch.no_grad()
def draw_weights(root: nn.Module, gen: torch.Generator) -> None:
    for name, tensor in sorted(root.state_dict(keep_vars=True).items()):
        path, _, leaf = name.rpartition(".")
        owner = root.get_submodule(path) if path else root
        if leaf == "freqs" or name in ("latent_mean", "latent_std"):
            continue  # fixed by the config / drawn after
        if leaf == "scale":
            tensor.fill_(0.1)  # layer scales
        elif isinstance(owner, (nn.LayerNorm, nn.Embedding)) or leaf == "bos_latent" or tensor.dim() == 1:
            tensor.normal_(1.0 if leaf == "weight" and isinstance(owner, nn.LayerNorm) else 0.0,
                           0.1 if isinstance(owner, nn.LayerNorm) or leaf == "bias" else 1.0, generator=gen)
        elif isinstance(owner, nn.ConvTranspose1d):
            fan_in = tensor.shape[1] * tensor.shape[2] * owner.groups // owner.stride[0]
            tensor.normal_(0.0, fan_in**-0.5, generator=gen)
        else:  # linears and convs: activations of order one; linears a little below, so the latents fed
            # back frame after frame do not amplify float rounding into a chaotic difference
            gain = LINEAR_GAIN if isinstance(owner, nn.Linear) else 1.0
            tensor.normal_(0.0, gain * tensor[0].numel() ** -0.5, generator=gen)


def cached_checkpoint(name: str) -> Path:
    """``--model pocket-tiny`` (LSD head) / ``pocket-tiny-drifting``, made on first use."""
    flow_type = "drifting" if name.endswith("-drifting") else "lsd"
    return cached_build(f"{name}-v{CACHE_VERSION}-seed0", lambda out: make_tiny_pocket(out, flow_type=flow_type),
                        marker=f"{CODEC_FOLDER}/model.safetensors")


def make_tiny_command(args: argparse.Namespace) -> int:
    """``omnistage make-tiny --model-type pocket_tts [--size tiny|full] OUT``."""
    size = getattr(args, "size", "tiny") or "tiny"
    if size not in SIZES:
        print(f"make-tiny --model-type pocket_tts: --size is one of {sorted(SIZES)}", file=sys.stderr)
        return 2
    if getattr(args, "cached", False) and size == "tiny":
        print(cached_checkpoint("pocket-tiny"))
        return 0
    if args.out_dir is None:
        print("make-tiny --model-type pocket_tts: give OUT_DIR (or --cached)", file=sys.stderr)
        return 2
    print(make_tiny_pocket(args.out_dir, seed=args.seed, size=size))
    return 0


def _write_json(path: Path, value: object) -> None:
    path.write_text(json.dumps(value, indent=2, sort_keys=True) + "\n")


def _save(state: dict[str, torch.Tensor], path: Path) -> None:
    save_file({n: t.detach().contiguous() for n, t in sorted(state.items())}, str(path), metadata={"format": "pt"})
