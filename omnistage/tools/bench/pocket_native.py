"""A Pocket TTS checkpoint in transformers' layout rewritten in the ``pocket-tts`` package's own layout, so its
runtime loads the same random weights (``bench serve --baseline pocket-tts``).

Writes ``native/model.safetensors`` (``flow_lm.*`` and ``mimi.*``), ``native/tokenizer.json`` (the checkpoint's,
padded with unused tokens to the package's ``n_bins``, which it requires to equal the vocabulary) and
``native/config.yaml`` (its ``--config``: the shapes, ``weights_path`` the local file). The names are the
package's; the fused ``in_proj`` of its attention is ``[q; k; v]`` with each head's rows interleaved, because its
rotary embedding rotates pairs ``(2i, 2i + 1)`` where transformers rotates ``(i, i + d/2)``.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from omnistage.families.pocket_tts.config import CODEC_FOLDER, PocketCheckpoint

NATIVE = "native"


def _interleave(weight: torch.Tensor, head_dim: int) -> torch.Tensor:
    """Rows ``(i, i + d/2)`` of each head -> rows ``(2i, 2i + 1)``."""
    heads = weight.shape[0] // head_dim
    w = weight.view(heads, 2, head_dim // 2, -1)
    return w.transpose(1, 2).reshape(weight.shape)


def _attention(src: dict[str, torch.Tensor], hf: str, native: str, head_dim: int) -> dict[str, torch.Tensor]:
    q, k, v = (src[f"{hf}.self_attn.{p}_proj.weight"] for p in "qkv")
    out = {f"{native}.self_attn.in_proj.weight": torch.cat([_interleave(q, head_dim), _interleave(k, head_dim), v]),
           f"{native}.self_attn.out_proj.weight": src[f"{hf}.self_attn.o_proj.weight"],
           f"{native}.linear1.weight": src[f"{hf}.mlp.fc1.weight"],
           f"{native}.linear2.weight": src[f"{hf}.mlp.fc2.weight"]}
    for i, norm in ((1, "input_layernorm"), (2, "post_attention_layernorm")):
        for leaf in ("weight", "bias"):
            out[f"{native}.norm{i}.{leaf}"] = src[f"{hf}.{norm}.{leaf}"]
    for i, scale in ((1, "self_attn_layer_scale"), (2, "mlp_layer_scale")):
        if f"{hf}.{scale}.scale" in src:
            out[f"{native}.layer_scale_{i}.scale"] = src[f"{hf}.{scale}.scale"]
    return out


_FLOW = ((r"timestep_embeddings\.(\d+)\.fc1", r"time_embed.\1.mlp.0"), (r"timestep_embeddings\.(\d+)\.fc2",
         r"time_embed.\1.mlp.2"), (r"timestep_embeddings\.(\d+)\.norm\.weight", r"time_embed.\1.mlp.3.alpha"),
         (r"timestep_embeddings\.(\d+)\.freqs", r"time_embed.\1.freqs"), (r"^cond_proj", "cond_embed"),
         (r"layers\.(\d+)\.norm", r"res_blocks.\1.in_ln"), (r"layers\.(\d+)\.fc1", r"res_blocks.\1.mlp.0"),
         (r"layers\.(\d+)\.fc2", r"res_blocks.\1.mlp.2"), (r"layers\.(\d+)\.adaln_proj",
         r"res_blocks.\1.adaLN_modulation.1"), (r"final_layer\.proj", "final_layer.linear"),
         (r"final_layer\.adaln_proj", "final_layer.adaLN_modulation.1"))


def flow_lm_tensors(src: dict[str, torch.Tensor], ckpt: PocketCheckpoint) -> dict[str, torch.Tensor]:
    cfg = ckpt.model
    embed = src["model.embed_tokens.weight"]
    table = torch.zeros(cfg.audio_prompt_token_id + 1, embed.shape[1])  # n_bins + 1 rows: the last pads
    table[:cfg.audio_prompt_token_id] = embed[:cfg.audio_prompt_token_id]
    out = {"flow_lm.bos_emb": src["model.bos_latent"], "flow_lm.emb_mean": src["latent_mean"],
           "flow_lm.emb_std": src["latent_std"], "flow_lm.conditioner.embed.weight": table,
           "flow_lm.bos_before_voice": embed[cfg.audio_prompt_bos_token_id].view(1, 1, -1),
           "flow_lm.input_linear.weight": src["model.audio_latent_proj.weight"],
           "flow_lm.speaker_proj_weight": src["model.audio_prompt_proj.weight"],
           "flow_lm.out_norm.weight": src["model.norm.weight"], "flow_lm.out_norm.bias": src["model.norm.bias"],
           "flow_lm.out_eos.weight": src["eos_head.weight"], "flow_lm.out_eos.bias": src["eos_head.bias"]}
    for i in range(cfg.num_hidden_layers):
        out.update(_attention(src, f"model.layers.{i}", f"flow_lm.transformer.layers.{i}", cfg.head_dim))
    for name, tensor in src.items():
        if name.startswith("flow_head."):
            native = name.removeprefix("flow_head.")
            for pattern, repl in _FLOW:
                native = re.sub(pattern, repl, native)
            out[f"flow_lm.flow_net.{native}"] = tensor
    return out


def mimi_tensors(src: dict[str, torch.Tensor], ckpt: PocketCheckpoint) -> dict[str, torch.Tensor]:
    codec = ckpt.codec
    out = {"mimi.quantizer.output_proj.weight": src["latent_proj.weight"],
           "mimi.downsample.conv.conv.weight": src["encoder.downsample.conv.weight"],
           "mimi.upsample.convtr.convtr.weight": src["decoder.upsample.conv.weight"]}
    for side, seanet in (("encoder", "encoder"), ("decoder", "decoder")):
        for name, tensor in src.items():
            match = re.match(rf"{side}\.{side}_seanet\.layers\.(.*)", name)
            if match:
                rest = match.group(1)
                transposed = f"{side}.{side}_seanet.layers.{rest.split('.')[0]}" in _transposed(codec)
                out[f"mimi.{seanet}.model.{rest.replace('.conv.', '.convtr.') if transposed else rest}"] = tensor
        for i in range(codec.num_hidden_layers):
            out.update(_attention(src, f"{side}.{side}_transformer.layers.{i}",
                                  f"mimi.{side}_transformer.transformer.layers.{i}", codec.head_dim))
    return out


def _transposed(codec) -> set[str]:  # noqa: ANN001
    """The decoder's transposed convs: right after each ELU that follows the first conv, one per ratio."""
    index, found = 1, set()
    for _ in codec.upsampling_ratios:
        found.add(f"decoder.decoder_seanet.layers.{index + 1}")
        index += 2 + codec.num_residual_layers
    return found


def write_native(folder: str | Path) -> Path:
    """``folder/native/config.yaml`` (made once per checkpoint folder)."""
    folder = Path(folder)
    ckpt = PocketCheckpoint.from_folder(folder)
    out = folder / NATIVE
    out.mkdir(exist_ok=True)
    src = {**load_file(str(folder / "model.safetensors")),
           **load_file(str(folder / CODEC_FOLDER / "model.safetensors"))}
    tensors = {**flow_lm_tensors(src, ckpt), **mimi_tensors(src, ckpt)}
    save_file({k: v.float().contiguous() for k, v in sorted(tensors.items())}, str(out / "model.safetensors"))
    _write_tokenizer(folder, out, ckpt.model.audio_prompt_token_id)
    (out / "config.yaml").write_text(json.dumps(native_config(ckpt, out), indent=1))  # JSON is YAML
    return out / "config.yaml"


def _write_tokenizer(folder: Path, out: Path, n_bins: int) -> None:
    from tokenizers import AddedToken, Tokenizer

    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    missing = n_bins - tok.get_vocab_size()
    if missing < 0:
        raise ValueError(f"the tokenizer has {tok.get_vocab_size()} entries, more than the {n_bins} text ids")
    tok.add_special_tokens([AddedToken(f"<unused_{i}>", special=True) for i in range(missing)])
    tok.save(str(out / "tokenizer.json"))


def native_config(ckpt: PocketCheckpoint, out: Path) -> dict[str, object]:
    cfg, codec = ckpt.model, ckpt.codec
    seanet = {"dimension": codec.hidden_size, "channels": 1, "n_filters": codec.num_filters,
              "n_residual_layers": codec.num_residual_layers, "ratios": list(codec.upsampling_ratios),
              "kernel_size": codec.kernel_size, "residual_kernel_size": codec.residual_kernel_size,
              "last_kernel_size": codec.last_kernel_size, "dilation_base": codec.dilation_growth_rate,
              "pad_mode": "constant", "compress": codec.compress}
    transformer = {"d_model": codec.hidden_size, "num_heads": codec.num_attention_heads,
                   "num_layers": codec.num_hidden_layers, "layer_scale": codec.layer_scale_initial_scale,
                   "context": codec.sliding_window, "dim_feedforward": codec.intermediate_size,
                   "input_dimension": codec.hidden_size, "output_dimensions": [codec.hidden_size],
                   "max_period": codec.rope_theta}
    return {"weights_path": str(out / "model.safetensors"), "default_temperature": 0.3,
            "flow_lm": {"dtype": "float32", "insert_bos_before_voice": True,
                        "flow": {"dim": cfg.flow_head.hidden_size, "depth": cfg.flow_head.num_hidden_layers,
                                 "type": cfg.flow_head.flow_type},
                        "transformer": {"d_model": cfg.hidden_size, "hidden_scale": cfg.intermediate_size //
                                        cfg.hidden_size, "max_period": int(cfg.rope_theta),
                                        "num_heads": cfg.num_attention_heads, "num_layers": cfg.num_hidden_layers,
                                        "dim_feedforward": cfg.intermediate_size},
                        "lookup_table": {"dim": cfg.hidden_size, "n_bins": cfg.audio_prompt_token_id,
                                         "tokenizer": "tokenizers", "tokenizer_path": str(out / "tokenizer.json")}},
            "mimi": {"dtype": "float32", "sample_rate": codec.sampling_rate, "channels": 1,
                     "frame_rate": codec.sampling_rate / codec.frame_size, "inner_dim": codec.latent_dim,
                     "outer_dim": codec.hidden_size, "seanet": seanet, "transformer": transformer,
                     "quantizer": {"dimension": codec.latent_dim, "output_dimension": codec.hidden_size}}}
