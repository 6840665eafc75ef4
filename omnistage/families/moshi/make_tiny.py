"""``omnistage make-tiny --model-type moshi``: a random Moshi checkpoint (transformers' or PersonaPlex's layout).

The weights are transformers' own random init of ``MoshiForConditionalGeneration`` under ``--seed`` (the
family's plain-random case: nothing tuned to make parity easy), saved by ``save_pretrained``, with a byte-level
BPE ``tokenizer.json`` whose ids stay below the text vocabulary. Sizes:

* ``tiny``: toy widths, a 24-frame attention window (tests cross it), Mimi with 8 codebooks of 64 entries;
* ``medium``: widths for measurements (temporal 512 x 6 layers, depth 128 x 2), Moshi's 3000-frame window and the
  real codec layout (Mimi's 32 codebooks of 2048 entries, Moshi reading 8) at reduced codec widths.

``--layout personaplex`` writes the same language model in Kyutai's layout with PersonaPlex's 16-step depth
decoder (``model.safetensors`` with Kyutai's names, ``config.json`` holding ``lm_config``; Mimi in ``mimi/``).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file

from omnistage.families.moshi.config import MoshiConfig
from omnistage.families.moshi.duplex_model import FRAMES_FILE
from omnistage.families.moshi.kyutai_layout import to_kyutai
from omnistage.tiny.cache import cached_build
from omnistage.tiny.tokenizer import train_tokenizer

BPE_SIZE = 400
CACHE_VERSION = 1
LAYOUTS = ("transformers", "personaplex")
_TINY_MIMI = {"hidden_size": 32, "num_filters": 8, "num_hidden_layers": 1, "intermediate_size": 64,
              "num_attention_heads": 2, "num_key_value_heads": 2, "codebook_dim": 16,
              "vector_quantization_hidden_dimension": 16, "num_quantizers": 8, "codebook_size": 64,
              "upsample_groups": 32, "sliding_window": 16}
# Mimi's real codec layout (32 codebooks of 2048, 256-wide codebook vectors, 24 kHz, 1920 samples a frame) at
# a fraction of its published widths (512 wide, 8 layers, 64 filters): four sessions' encode and decode stay a
# share of the frame on two CPU cores, as Qwen3-Omni's medium code2wav does.
_MEDIUM_MIMI = {"hidden_size": 128, "num_filters": 16, "num_hidden_layers": 2, "intermediate_size": 512,
                "num_attention_heads": 4, "num_key_value_heads": 4, "upsample_groups": 128}
SIZES: dict[str, dict[str, object]] = {
    "tiny": {"vocab_size": 512, "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
             "ffn_dim": 256, "sliding_window": 24, "max_position_embeddings": 4096,
             "depth": {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "ffn_dim": 128},
             "mimi": _TINY_MIMI},
    "medium": {"vocab_size": 2048, "hidden_size": 512, "num_hidden_layers": 6, "num_attention_heads": 8,
               "ffn_dim": 2816, "sliding_window": 3000, "max_position_embeddings": 3000,
               # the depth transformer about a tenth of the temporal one's weights, as in Moshi (6 x 1024 against
               # 32 x 4096): all 8 of its steps read their own weights every frame
               "depth": {"hidden_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4, "ffn_dim": 704},
               "mimi": _MEDIUM_MIMI},
}


def _hf_config(size: str):  # noqa: ANN202 - transformers' MoshiConfig
    from transformers import MimiConfig
    from transformers import MoshiConfig as HFMoshiConfig

    spec = dict(SIZES[size])
    depth, mimi = spec.pop("depth"), spec.pop("mimi")
    return HFMoshiConfig(audio_encoder_config=MimiConfig(**mimi).to_dict(), depth_decoder_config=dict(depth),
                         num_codebooks=8, rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, **spec)


def make_tiny_moshi(out_dir: str | Path, seed: int = 0, size: str = "tiny", layout: str = "transformers") -> Path:
    from transformers import MoshiForConditionalGeneration

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    with torch.random.fork_rng():  # transformers' init draws from the global generator: seeded, then restored
        torch.manual_seed(seed)
        model = MoshiForConditionalGeneration(_hf_config(size)).eval()
    if layout == "personaplex":
        _save_personaplex(model, out)
    else:
        model.save_pretrained(out)
    _write_mimi_frames(model, out)
    train_tokenizer(BPE_SIZE).save(str(out / "tokenizer.json"))
    return out


@torch.inference_mode()
def _write_mimi_frames(model, out: Path) -> None:  # noqa: ANN001 - transformers' model
    """The random Mimi's codes of a silent frame and of PersonaPlex's 440 Hz sine frame (amplitude 0.5), which
    the duplex loop hears where the user's input is missing and during a PersonaPlex prompt."""
    mimi, k = model.audio_encoder, model.config.num_codebooks
    n = int(model.config.sampling_rate / model.config.audio_encoder_config.frame_rate)
    t = torch.arange(n, dtype=torch.float32) / model.config.sampling_rate
    frames = torch.stack([torch.zeros(n), 0.5 * torch.sin(2 * torch.pi * 440.0 * t)])[:, None]
    codes = mimi.encode(frames, num_quantizers=k)[0][:, :, 0]
    (out / FRAMES_FILE).write_text(json.dumps({"silence": codes[0].tolist(), "sine": codes[1].tolist()}) + "\n")


def _save_personaplex(model, out: Path) -> None:  # noqa: ANN001 - transformers' model
    """Kyutai's layout with 16 depth steps: the 8 agent steps' weights drawn, the user's 8 their copies plus noise
    (so a loader that mixes steps up is caught)."""
    hf = model.config
    raw = {"model_type": "moshi", "lm_config": _lm_config(hf), "mimi_config": hf.audio_encoder_config.to_dict()}
    cfg = MoshiConfig.from_dict(raw)
    state = {n: t.detach() for n, t in model.state_dict().items() if not n.startswith("audio_encoder.")}
    gen = torch.Generator().manual_seed(1)
    for name, t in list(state.items()):
        if name.startswith("depth_decoder.") and t.dim() == 3 and t.shape[0] == hf.num_codebooks:
            state[name] = torch.cat([t, t + 0.1 * torch.randn(t.shape, generator=gen) * t.std()])
    for k in range(hf.num_codebooks - 1, 2 * hf.num_codebooks - 1):  # the user steps' inputs
        src = state[f"depth_decoder.embed_tokens.{k - hf.num_codebooks + 1}.weight"]
        state[f"depth_decoder.embed_tokens.{k}.weight"] = src + 0.1 * torch.randn(src.shape, generator=gen)
    save_file(to_kyutai(state, cfg), str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(raw, indent=2, sort_keys=True) + "\n")
    model.audio_encoder.save_pretrained(out / "mimi")


def _lm_config(hf) -> dict[str, object]:  # noqa: ANN001 - transformers' MoshiConfig
    """Kyutai's ``LMModel`` arguments for transformers' sizes (``dep_q`` 16: PersonaPlex)."""
    d = hf.depth_decoder_config
    return {"dim": hf.hidden_size, "text_card": hf.vocab_size, "existing_text_padding_id": 3,
            "n_q": 2 * hf.num_codebooks, "dep_q": 2 * hf.num_codebooks, "card": hf.audio_vocab_size,
            "num_heads": hf.num_attention_heads, "num_layers": hf.num_hidden_layers,
            "hidden_scale": hf.ffn_dim / 2 * 3 / 2 / hf.hidden_size, "context": hf.sliding_window,
            "max_period": 10000, "depformer_dim": d.hidden_size, "depformer_dim_feedforward": d.ffn_dim // 2 * 3 // 2,
            "depformer_num_heads": d.num_attention_heads, "depformer_num_layers": d.num_hidden_layers,
            "delays": [0] + ([0] + [1] * (hf.num_codebooks - 1)) * 2}


def cached_checkpoint(name: str) -> Path:
    """``--model moshi-tiny`` / ``moshi-medium`` / ``personaplex-tiny``, made on first use."""
    size = "medium" if name.endswith("medium") else "tiny"
    layout = "personaplex" if name.startswith("personaplex") else "transformers"
    return cached_build(f"{name}-v{CACHE_VERSION}-seed0", lambda out: make_tiny_moshi(out, size=size, layout=layout),
                        marker="tokenizer.json")


def make_tiny_command(args: argparse.Namespace) -> int:
    """``omnistage make-tiny --model-type moshi [--size tiny|medium] [--layout personaplex] OUT``."""
    size, layout = getattr(args, "size", "tiny") or "tiny", getattr(args, "layout", None) or "transformers"
    if size not in SIZES or layout not in LAYOUTS:
        print(f"make-tiny --model-type moshi: --size one of {sorted(SIZES)}, --layout one of {LAYOUTS}",
              file=sys.stderr)
        return 2
    if args.out_dir is None:
        print("make-tiny --model-type moshi: give OUT_DIR", file=sys.stderr)
        return 2
    print(make_tiny_moshi(args.out_dir, seed=args.seed, size=size, layout=layout))
    return 0
