"""Kyutai's ``LMModel`` tensor names (the ``moshi`` package, PersonaPlex) to and from transformers' names.

What differs beyond names:

* fused ``in_proj_weight`` ([3D, D]; the depth transformer's stacked over steps, [steps * 3D, D]) against
  separate q/k/v, and the depth's ``out_proj`` stacked over steps;
* rotary pairs: Kyutai rotates adjacent channels (2i, 2i+1), transformers channel i with i + D/2, so the
  temporal q and k rows are permuted per head (the rule transformers' conversion applies);
* norms' ``alpha`` [1, 1, D] against ``weight`` [D]; per-step modules (``depformer_in.k``, ``gating.k``,
  ``linears.k``) against stacked ``[steps, out, in]`` tensors.

PersonaPlex's depth decoder has 16 steps; a Moshiko checkpoint read into it has 8, and its loader fills the
missing steps 8..15 from 0..7 (self-attention's stacked tensors repeated, ``gating``/``linears``/
``depformer_in``/``depformer_emb`` step ``k`` from ``k - 8``): :func:`from_kyutai` does the same.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch

from omnistage.families.moshi.config import MoshiConfig

Reader = Callable[[str], torch.Tensor]
AGENT_STEPS = 8  # the steps of a Moshiko depth decoder, which PersonaPlex's loader repeats


def _pairs_to_halves(w: torch.Tensor, heads: int) -> torch.Tensor:
    rows, cols = w.shape
    return w.view(heads, rows // heads // 2, 2, cols).transpose(1, 2).reshape(rows, cols)


def _halves_to_pairs(w: torch.Tensor, heads: int) -> torch.Tensor:
    rows, cols = w.shape
    return w.view(heads, 2, rows // heads // 2, cols).transpose(1, 2).reshape(rows, cols)


def from_kyutai(read: Reader, names: Iterable[str], cfg: MoshiConfig) -> dict[str, torch.Tensor]:
    """transformers-named tensors from a Kyutai checkpoint (``read(name)``, its tensor ``names``)."""
    have = set(names)
    out: dict[str, torch.Tensor] = {"decoder.model.embed_tokens.weight": read("text_emb.weight"),
                                    "decoder.lm_head.weight": read("text_linear.weight"),
                                    "decoder.model.norm.weight": read("out_norm.alpha").reshape(-1),
                                    "depth_decoder.text_embed_tokens.weight": read("depformer_text_emb.weight")}
    for k in range(2 * cfg.num_codebooks):
        out[f"embed_tokens.{k}.weight"] = read(f"emb.{k}.weight")
    for i in range(cfg.num_layers):
        out.update(_temporal_layer(read, i, cfg))
    steps = cfg.depth.steps

    def per_step(name: str) -> torch.Tensor:  # step k's module, or (PersonaPlex's rule) step k - 8's
        return torch.stack([read(name.format(k if name.format(k) in have else k - AGENT_STEPS))
                            for k in range(steps)])

    out["depth_decoder.input_projections.weight"] = per_step("depformer_in.{}.weight")
    out["depth_decoder.lm_heads.weight"] = per_step("linears.{}.weight")
    for k in range(steps - 1):
        out[f"depth_decoder.embed_tokens.{k}.weight"] = _step_input(read, have, k)
    for i in range(cfg.depth.num_layers):
        out.update(_depth_layer(read, per_step, i, cfg))
    return out


def _step_input(read: Reader, have: set[str], k: int) -> torch.Tensor:
    """Depth step ``k + 1``'s input table. An 8-step checkpoint has tables 0..6: 8..14 are copied from k - 8
    (PersonaPlex's rule), and table 7 (step 8's, the user's first code) has no source; its loader leaves it at its
    random init, here zeros: a duplex session runs the agent's 8 steps only, so it is never read."""
    for src in (k, k - AGENT_STEPS):
        if f"depformer_emb.{src}.weight" in have:
            return read(f"depformer_emb.{src}.weight")
    return torch.zeros_like(read("depformer_emb.0.weight"))


def _temporal_layer(read: Reader, i: int, cfg: MoshiConfig) -> dict[str, torch.Tensor]:
    src, dst = f"transformer.layers.{i}.", f"decoder.model.layers.{i}."
    q, k, v = read(src + "self_attn.in_proj_weight").chunk(3)
    return {dst + "self_attn.q_proj.linear.weight": _pairs_to_halves(q, cfg.num_heads),
            dst + "self_attn.k_proj.linear.weight": _pairs_to_halves(k, cfg.num_kv_heads),
            dst + "self_attn.v_proj.linear.weight": v,
            dst + "self_attn.o_proj.linear.weight": read(src + "self_attn.out_proj.weight"),
            dst + "input_layernorm.weight": read(src + "norm1.alpha").reshape(-1),
            dst + "post_attention_layernorm.weight": read(src + "norm2.alpha").reshape(-1),
            dst + "mlp.fc1.weight": read(src + "gating.linear_in.weight"),
            dst + "mlp.fc2.weight": read(src + "gating.linear_out.weight")}


def _depth_layer(read: Reader, per_step: Callable[[str], torch.Tensor], i: int,
                 cfg: MoshiConfig) -> dict[str, torch.Tensor]:
    src, dst = f"depformer.layers.{i}.", f"depth_decoder.layers.{i}."
    steps, dim = cfg.depth.steps, cfg.depth.hidden_size
    in_proj = _all_steps(read(src + "self_attn.in_proj_weight"), steps, 3 * dim).view(steps, 3, dim, dim)
    out_proj = _all_steps(read(src + "self_attn.out_proj.weight"), steps, dim).view(steps, dim, dim)
    return {dst + "self_attn.q_proj.linear.weight": in_proj[:, 0], dst + "self_attn.k_proj.linear.weight":
            in_proj[:, 1], dst + "self_attn.v_proj.linear.weight": in_proj[:, 2],
            dst + "self_attn.o_proj.linear.weight": out_proj,
            dst + "input_layernorm.weight": read(src + "norm1.alpha").reshape(-1),
            dst + "post_attention_layernorm.weight": read(src + "norm2.alpha").reshape(-1),
            dst + "mlp.fc1.weight": per_step(src + "gating.{}.linear_in.weight"),
            dst + "mlp.fc2.weight": per_step(src + "gating.{}.linear_out.weight")}


def _all_steps(stacked: torch.Tensor, steps: int, rows_per_step: int) -> torch.Tensor:
    """A stacked per-step tensor with every step: a Moshiko tensor of 8 steps concatenated with itself
    (PersonaPlex's rule)."""
    if stacked.shape[0] < steps * rows_per_step:
        stacked = torch.cat([stacked, stacked])[:steps * rows_per_step]
    return stacked


def to_kyutai(state: dict[str, torch.Tensor], cfg: MoshiConfig) -> dict[str, torch.Tensor]:
    """The inverse of :func:`from_kyutai` (every step written): what make-tiny's ``--layout personaplex`` saves."""
    out = {"text_emb.weight": state["decoder.model.embed_tokens.weight"],
           "text_linear.weight": state["decoder.lm_head.weight"],
           "out_norm.alpha": state["decoder.model.norm.weight"].view(1, 1, -1),
           "depformer_text_emb.weight": state["depth_decoder.text_embed_tokens.weight"]}
    for k in range(2 * cfg.num_codebooks):
        out[f"emb.{k}.weight"] = state[f"embed_tokens.{k}.weight"]
    for i in range(cfg.num_layers):
        src, dst = f"decoder.model.layers.{i}.", f"transformer.layers.{i}."
        q = _halves_to_pairs(state[src + "self_attn.q_proj.linear.weight"], cfg.num_heads)
        k = _halves_to_pairs(state[src + "self_attn.k_proj.linear.weight"], cfg.num_kv_heads)
        out[dst + "self_attn.in_proj_weight"] = torch.cat([q, k, state[src + "self_attn.v_proj.linear.weight"]])
        out[dst + "self_attn.out_proj.weight"] = state[src + "self_attn.o_proj.linear.weight"]
        out.update(_kyutai_norms_mlp(state, src, dst))
    for k in range(cfg.depth.steps):
        out[f"depformer_in.{k}.weight"] = state["depth_decoder.input_projections.weight"][k]
        out[f"linears.{k}.weight"] = state["depth_decoder.lm_heads.weight"][k]
    for k in range(cfg.depth.steps - 1):
        out[f"depformer_emb.{k}.weight"] = state[f"depth_decoder.embed_tokens.{k}.weight"]
    for i in range(cfg.depth.num_layers):
        src, dst = f"depth_decoder.layers.{i}.", f"depformer.layers.{i}."
        qkv = torch.stack([state[src + f"self_attn.{p}_proj.linear.weight"] for p in "qkv"], dim=1)
        out[dst + "self_attn.in_proj_weight"] = qkv.reshape(-1, qkv.shape[-1])
        o = state[src + "self_attn.o_proj.linear.weight"]
        out[dst + "self_attn.out_proj.weight"] = o.reshape(-1, o.shape[-1])
        out[dst + "norm1.alpha"] = state[src + "input_layernorm.weight"].view(1, 1, -1)
        out[dst + "norm2.alpha"] = state[src + "post_attention_layernorm.weight"].view(1, 1, -1)
        for k in range(cfg.depth.steps):
            out[dst + f"gating.{k}.linear_in.weight"] = state[src + "mlp.fc1.weight"][k]
            out[dst + f"gating.{k}.linear_out.weight"] = state[src + "mlp.fc2.weight"][k]
    return {name: t.contiguous() for name, t in out.items()}


def _kyutai_norms_mlp(state: dict[str, torch.Tensor], src: str, dst: str) -> dict[str, torch.Tensor]:
    return {dst + "norm1.alpha": state[src + "input_layernorm.weight"].view(1, 1, -1),
            dst + "norm2.alpha": state[src + "post_attention_layernorm.weight"].view(1, 1, -1),
            dst + "gating.linear_in.weight": state[src + "mlp.fc1.weight"],
            dst + "gating.linear_out.weight": state[src + "mlp.fc2.weight"]}
