"""Turning a loaded model's linears and experts into quantized ones, in place.

Which weights: those the layers offer (``quantizable_linears()`` of attention and MLP blocks) and the fused
experts. Norms, routers and the shared-expert gate, embeddings, heads, RoPE, the encoders and the vocoder are
never offered, so they stay in the model's precision (audio quality and routing decisions depend on them).
"""

from __future__ import annotations

import torch
from torch import nn

from omnistage.layers.moe import FusedExperts
from omnistage.layers.quant.fp8 import FP8
from omnistage.layers.quant.int8 import quantize_rows, scale_dtype
from omnistage.layers.quant.w8a8 import mark_dynamic_inputs_

QUANTIZATIONS = ("none", "int8", "w8a8")  # on the fly; pre-quantized FP8 checkpoints are recognised from their config


def quantizable(model: nn.Module) -> tuple[list[nn.Linear], list[FusedExperts]]:
    linears, experts = [], []
    for module in model.modules():
        offer = getattr(module, "quantizable_linears", None)
        if offer is not None:
            linears += offer()
        if isinstance(module, FusedExperts):
            experts.append(module)
    return linears, experts


def _is_full_precision(weight: torch.Tensor) -> bool:
    return weight.is_floating_point() and weight.element_size() > 1


def int8_weights(model: nn.Module) -> dict[str, tuple[nn.Module, str]]:
    """The weights ``int8`` quantizes, by their name in ``model``: (owning module, attribute). A loader quantizes
    each of these as it reads it, so the full-precision model is never held whole."""
    linears, experts = quantizable(model)
    wanted = {id(m): ("weight",) for m in linears} | {id(m): ("gate_up_proj", "down_proj") for m in experts}
    found = {}
    for path, module in model.named_modules():
        for attr in wanted.get(id(module), ()):
            found[f"{path}.{attr}" if path else attr] = (module, attr)
    return found


def store_int8_(module: nn.Module, attr: str, q: torch.Tensor, scale: torch.Tensor) -> None:
    """``module.<attr>`` becomes the int8 values ``q`` with ``scale`` beside it (``weight_scale`` for a linear's
    weight, ``<attr>_scale`` for fused experts), where the int8 matmuls look for them."""
    setattr(module, attr, nn.Parameter(q, requires_grad=False))
    scale_name = "weight_scale" if attr == "weight" else f"{attr}_scale"
    module.register_buffer(scale_name, scale)  # replaces a registered one (FusedExperts register theirs as None)


@torch.no_grad()
def quantize_int8_(model: nn.Module) -> int:
    """Weight-only int8 (one scale per output row) for every quantizable weight still in full precision; weights
    already quantized (an FP8 checkpoint's, or int8 quantized as loaded) are left as they are. Returns the number
    of tensors quantized."""
    count = 0
    for module, attr in int8_weights(model).values():
        weight = getattr(module, attr)
        if _is_full_precision(weight):
            store_int8_(module, attr, *quantize_rows(weight, scale_dtype(weight.device, weight.dtype)))
            count += 1
    return count


def fp8_storage_(module: nn.Module, name: str) -> None:
    """Re-creates ``module.<name>`` as an empty FP8 tensor of the same shape and a float32 per-row scale
    (``<name>_scale``, or ``weight_scale`` for a linear's ``weight``), for a checkpoint's FP8 values to be loaded
    into as they are."""
    weight = getattr(module, name)
    setattr(module, name, nn.Parameter(torch.empty(weight.shape, dtype=FP8, device=weight.device),
                                       requires_grad=False))
    scale = torch.empty(weight.shape[:-1], dtype=torch.float32, device=weight.device)
    scale_name = "weight_scale" if name == "weight" else f"{name}_scale"
    if scale_name in module._buffers:
        setattr(module, scale_name, scale)
    else:
        module.register_buffer(scale_name, scale)


def apply_quantization(model: nn.Module, quantization: str) -> None:
    """A stage's ``quantization`` after its weights are loaded: ``none``, ``int8`` (weight-only, per row) or
    ``w8a8`` (the same int8 weights, times per-token int8 activations from a few rows up on CPU)."""
    if quantization in ("int8", "w8a8"):
        quantize_int8_(model)
        if quantization == "w8a8":
            mark_dynamic_inputs_(quantizable(model)[0])
    elif quantization not in ("none", ""):
        raise ValueError(f"unknown quantization {quantization!r}; known: {', '.join(QUANTIZATIONS)}")
