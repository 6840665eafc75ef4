"""``omnistage make-tiny --fp8``: a made checkpoint rewritten as a ModelOpt FP8 checkpoint, for offline tests.

What NVIDIA ModelOpt's ``quant_algo: FP8`` export looks like on the hub, for the thinker's text decoder only:

* every attention projection, dense MLP linear, shared-expert linear and expert (one tensor per expert:
  ``experts.{e}.gate_proj.weight`` ...) stored as ``float8_e4m3fn`` with a 0-d float32 ``weight_scale``
  (per tensor, amax / 448);
* ``config.json`` gets ``quantization_config`` (``quant_method: modelopt``) and the folder an
  ``hf_quant_config.json``, both listing what stays in high precision (``exclude_modules``): the embeddings,
  the lm_head, routers (``mlp.gate``, ``shared_expert_gate``), the encoders, the talker and the vocoder;
* no ``input_scale``: that is a calibrated static activation scale, which random weights have no data for;
  omnistage quantises activations per token at run time and reads past it in real files.

``block`` writes block scales instead (``quant_algo: FP8_PB_WO``).
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from omnistage.layers.quant.fp8 import quantize_fp8

THINKER_LAYERS = "thinker.model.language_model.layers."
_LINEAR = re.compile(r"\.(self_attn\.[qkvo]_proj|mlp\.(gate|up|down)_proj|mlp\.shared_expert\.(gate|up|down)_proj)"
                     r"\.weight$")
_FUSED = re.compile(r"^(?P<base>.*\.mlp\.experts)\.(?P<kind>gate_up_proj|down_proj)$")
EXCLUDED = ["lm_head", "thinker.model.language_model.embed_tokens", "*.mlp.gate", "*.shared_expert_gate",
            "thinker.audio_tower*", "thinker.visual*", "talker*", "code2wav*"]


def _fp8(name: str, weight: torch.Tensor, block: tuple[int, int] | None) -> dict[str, torch.Tensor]:
    q, scale = quantize_fp8(weight, block)
    return {name: q, name + "_scale": scale}


def _expert_tensors(base: str, kind: str, fused: torch.Tensor,
                    block: tuple[int, int] | None) -> dict[str, torch.Tensor]:
    """A fused ``[E, 2I, H]`` gate_up (or ``[E, H, I]`` down) as the hub's per-expert FP8 tensors."""
    out: dict[str, torch.Tensor] = {}
    for e, weight in enumerate(fused):
        if kind == "gate_up_proj":
            gate, up = weight.chunk(2, dim=0)
            out |= _fp8(f"{base}.{e}.gate_proj.weight", gate, block)
            out |= _fp8(f"{base}.{e}.up_proj.weight", up, block)
        else:
            out |= _fp8(f"{base}.{e}.down_proj.weight", weight, block)
    return out


def fp8_tensors(tensors: dict[str, torch.Tensor], block: tuple[int, int] | None = None) -> dict[str, torch.Tensor]:
    """The checkpoint's tensors with the thinker decoder's linears and experts in FP8 (everything else as is)."""
    out: dict[str, torch.Tensor] = {}
    for name, tensor in sorted(tensors.items()):
        fused = _FUSED.match(name)
        if name.startswith(THINKER_LAYERS) and fused:
            out |= _expert_tensors(fused["base"], fused["kind"], tensor, block)
        elif name.startswith(THINKER_LAYERS) and _LINEAR.search(name):
            out |= _fp8(name, tensor, block)
        else:
            out[name] = tensor
    return out


def write_fp8_variant(src: str | Path, out: str | Path, block: tuple[int, int] | None = None) -> Path:
    """Copies the checkpoint folder ``src`` to ``out`` with its thinker decoder in ModelOpt FP8."""
    src, out = Path(src), Path(out)
    shutil.copytree(src, out, dirs_exist_ok=True, ignore=shutil.ignore_patterns("*.safetensors"))
    save_file(fp8_tensors(load_file(str(src / "model.safetensors")), block), str(out / "model.safetensors"),
              metadata={"format": "pt"})
    algo = "FP8" if block is None else "FP8_PB_WO"
    quant = {"quant_algo": algo, "kv_cache_quant_algo": None, "exclude_modules": EXCLUDED}
    if block is not None:
        quant["block_size"] = list(block)
    config = json.loads((out / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "modelopt", **quant}
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True))
    (out / "hf_quant_config.json").write_text(json.dumps({"producer": {"name": "modelopt"}, "quantization": quant},
                                                         indent=2))
    return out
