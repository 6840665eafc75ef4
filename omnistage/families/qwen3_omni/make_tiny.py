"""``omnistage make-tiny [--size tiny|medium|slice]``: a random Qwen3-Omni checkpoint, written offline.

The output is a Hugging Face folder (config.json, model.safetensors, tokenizer,
chat template, processor configs) that transformers' own
``Qwen3OmniMoeForConditionalGeneration`` and ``AutoProcessor`` load. Weights are
drawn from transformers' initialisers under a fixed seed and saved with sorted
names, so one seed always gives byte-identical files. The sizes are
:mod:`omnistage.families.qwen3_omni.checkpoint_sizes`.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file
from tqdm import tqdm

from omnistage.families.qwen3_omni.checkpoint_config import checkpoint_config_dict
from omnistage.families.qwen3_omni.checkpoint_sizes import SIZES, TINY, CheckpointSize
from omnistage.tiny.audible_vocoder import audible_vocoder
from omnistage.tiny.cache import cached_build
from omnistage.tiny.chat_template import QWEN3_OMNI_CHAT_TEMPLATE
from omnistage.tiny.confident_head import confident_head_
from omnistage.tiny.tokenizer import ROLE_WORDS, TokenizerLayout, save_tokenizer

BPE_SIZE = 960
# Bump when a made checkpoint's content changes, so caches are rebuilt.
TINY_VERSION = 2  # 2: tools in the chat template, <tool_call> decoded as text


def make_tiny(out_dir: str | Path, seed: int = 0, size: CheckpointSize = TINY, confident_head: bool = False) -> Path:
    """Writes a random checkpoint of ``size`` into ``out_dir`` (created; existing files replaced);
    ``confident_head``: with a trained model's greedy margins (:mod:`omnistage.tiny.confident_head`)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    # Phases, not bytes: the weights are drawn and written whole (the slice size's take minutes).
    with tqdm(total=3, desc=f"making the {size.name} checkpoint", unit="step", disable=None, leave=False) as bar:
        bar.set_postfix_str("tokenizer and config")
        layout = save_tokenizer(out, BPE_SIZE, QWEN3_OMNI_CHAT_TEMPLATE)
        role_ids = _role_ids(out)
        config = checkpoint_config_dict(layout, role_ids, size)
        (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True))
        bar.update()
        bar.set_postfix_str("drawing and writing the weights")
        _save_weights(out, seed, layout.bpe_size if confident_head else 0)
        bar.update()
        bar.set_postfix_str("processor")
        _save_processor(out)
        (out / "generation_config.json").write_text(json.dumps(_generation_config(layout), indent=2))
        bar.update()
    return out


def _role_ids(out: Path) -> dict[str, int]:
    vocab = json.loads((out / "vocab.json").read_text())
    return {word: vocab[word] for word in ROLE_WORDS}


def _save_weights(out: Path, seed: int, confident_tokens: int) -> None:
    """Draws the weights in the dtype config.json names (bf16 halves the peak memory of the ``slice`` size);
    ``confident_tokens`` > 0: the thinker's head made confident over that many ordinary tokens."""
    from transformers import Qwen3OmniMoeConfig, Qwen3OmniMoeForConditionalGeneration

    from omnistage.models.qwen3_omni.config import quiet_known_rope_keys

    with quiet_known_rope_keys():
        config = Qwen3OmniMoeConfig.from_pretrained(out)
    dtype = getattr(torch, json.loads((out / "config.json").read_text())["torch_dtype"])
    torch.manual_seed(seed)
    model = Qwen3OmniMoeForConditionalGeneration._from_config(config, dtype=dtype).eval()
    _init_experts(model, std=config.initializer_range)
    audible_vocoder(model.code2wav)
    state = {name: t.detach().contiguous() for name, t in sorted(model.state_dict().items())}
    if confident_tokens:
        confident_head_(state, confident_tokens, seed)
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})


@torch.no_grad()
def _init_experts(model: torch.nn.Module, std: float) -> None:
    """Draws every fused expert tensor from N(0, std).

    transformers 5.24 initialises only the thinker's experts; the talker's are
    left as ``torch.empty`` memory, which would make the checkpoint depend on
    whatever the allocator held (and not be reproducible).
    """
    for name, param in model.named_parameters():
        if name.endswith(("experts.gate_up_proj", "experts.down_proj")):
            param.normal_(0.0, std)


def _save_processor(out: Path) -> None:
    from transformers import WhisperFeatureExtractor
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    features = WhisperFeatureExtractor(
        feature_size=128, sampling_rate=16000, hop_length=160, chunk_length=300, n_fft=400,
        padding_value=0.0, return_attention_mask=True,
    )
    # Small pixel bounds keep tiny-model image prompts short on a CPU.
    images = Qwen2VLImageProcessorPil(
        patch_size=16, temporal_patch_size=2, merge_size=2,
        size={"shortest_edge": 32 * 32 * 4, "longest_edge": 32 * 32 * 64},
        image_mean=[0.5, 0.5, 0.5], image_std=[0.5, 0.5, 0.5],
    )
    features.save_pretrained(out)
    preprocessor = json.loads((out / "preprocessor_config.json").read_text())
    preprocessor.update(images.to_dict())
    preprocessor["processor_class"] = "Qwen3OmniMoeProcessor"
    (out / "preprocessor_config.json").write_text(json.dumps(preprocessor, indent=2, sort_keys=True))
    # transformers' video processor needs torchvision to load; written so that
    # AutoProcessor works wherever torchvision is installed.
    video = {
        "video_processor_type": "Qwen2VLVideoProcessor", "patch_size": 16, "temporal_patch_size": 2,
        "merge_size": 2, "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5],
        "size": {"shortest_edge": 32 * 32 * 4, "longest_edge": 32 * 32 * 64}, "do_sample_frames": False,
        "processor_class": "Qwen3OmniMoeProcessor",
    }
    (out / "video_preprocessor_config.json").write_text(json.dumps(video, indent=2, sort_keys=True))


def _generation_config(layout: TokenizerLayout) -> dict[str, object]:
    return {"eos_token_id": [layout.special_id("<|im_end|>")], "pad_token_id": layout.special_id("<|endoftext|>")}


def tiny_model_dir(seed: int = 0, size: CheckpointSize = TINY) -> Path:
    """The embedded checkpoint of ``size`` (the tiny one by default), made on first use under the cache folder."""
    return cached_build(f"{size.name}-v{TINY_VERSION}-seed{seed}", lambda out: make_tiny(out, seed=seed, size=size))


def cached_checkpoint(name: str) -> Path:
    """Qwen3-Omni's ``cached`` hook: the embedded random checkpoint of size ``name`` (made on first use)."""
    return tiny_model_dir(size=SIZES[name])


def make_tiny_command(args: argparse.Namespace) -> int:
    """Qwen3-Omni's ``make_tiny`` hook: ``omnistage make-tiny [--size S] [--cached] OUT``."""
    size = SIZES[args.size]
    if args.cached:
        print(tiny_model_dir(seed=args.seed, size=size))
        return 0
    if args.out_dir is None:
        print("make-tiny: give OUT_DIR or --cached", file=sys.stderr)
        return 2
    if args.fp8:
        from omnistage.families.qwen3_omni.make_fp8 import write_fp8_variant

        print(write_fp8_variant(tiny_model_dir(seed=args.seed, size=size), args.out_dir))
        return 0
    print(make_tiny(args.out_dir, seed=args.seed, size=size, confident_head=args.confident_head))
    return 0
