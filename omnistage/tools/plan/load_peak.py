"""``python -m omnistage.tools.plan.load_peak --model DIR --stage thinker --quantization int8``: the peak resident
memory while one stage loads, beside the plan's figure for that stage's weights.

Run it in a fresh process (it is one): the tiny checkpoint's stage is loaded first the same way (so the code
loading runs, torch's and transformers', is already resident), then the kernel's peak-RSS mark is reset
(``/proc/self/clear_refs``), so the peak printed is what loading added on top of a warmed interpreter. On a small
checkpoint glibc's heap moves the figure by 10-20 MB at random (worker threads' malloc arenas; freed heap kept
once a freed block raised the dynamic mmap threshold): ``OMP_NUM_THREADS=1 MALLOC_MMAP_THRESHOLD_=65536`` in the
environment takes that out (docs/memory_plan.md, "Loading").
``--load-then-quantize`` loads in full precision and quantizes afterwards (what omnistage did before loading
quantized as it read), to see the difference. Prints one JSON line.
"""

from __future__ import annotations

import argparse
import gc
import json
import re
from pathlib import Path

import torch

from omnistage.layers.quant.int8 import quantize_rows
from omnistage.tools.plan.footprint import footprints

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def _status_kib(field: str) -> int:
    match = re.search(rf"^{field}:\s+(\d+) kB", Path("/proc/self/status").read_text(), re.MULTILINE)
    if match is None:
        raise RuntimeError(f"/proc/self/status has no {field} (Linux only)")
    return int(match[1])


def _stage_class(stage: str) -> type:
    # The encoders' transformers module is imported here, before the baseline, like the stage's own code.
    import transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe  # noqa: F401

    from omnistage.models.qwen3_omni.talker import Talker
    from omnistage.models.qwen3_omni.thinker import Thinker

    return {"thinker": Thinker, "talker": Talker}[stage]


def _load_then_quantize(cls: type, folder: Path, dtype: torch.dtype, quantization: str) -> torch.nn.Module:
    from omnistage.layers.quant.apply import apply_quantization
    from omnistage.models.build import build_on
    from omnistage.models.decoder_checkpoint import load_checkpoint
    from omnistage.models.qwen3_omni.config import Qwen3OmniConfig
    from omnistage.models.qwen3_omni.thinker import HUB_NAMES, Thinker

    full = Qwen3OmniConfig.from_folder(folder).hf
    with build_on("cpu", dtype):
        model = cls(full.thinker_config, full.talker_config.accept_hidden_layer) if cls is Thinker \
            else cls(full.talker_config)
    load_checkpoint(model, folder, f"{cls.__name__.lower()}.", dtype, HUB_NAMES if cls is Thinker else {})
    apply_quantization(model, quantization)
    return model


def _load(cls: type, folder: Path, dtype: torch.dtype, quantization: str, load_then_quantize: bool) -> torch.nn.Module:
    if load_then_quantize:
        return _load_then_quantize(cls, folder, dtype, quantization)
    return cls.from_checkpoint(folder, "cpu", dtype, quantization=quantization)


def measure(folder: Path, stage: str, quantization: str, dtype: torch.dtype, load_then_quantize: bool) -> dict:
    from omnistage.families.registry import resolve_model

    cls = _stage_class(stage)
    _load(cls, resolve_model("tiny"), dtype, quantization, load_then_quantize)  # warms the code paths; dropped
    # The tiny tensors run no parallel region: start torch's worker threads (stacks, malloc arenas) here too.
    quantize_rows(torch.ones(1024, 1024, dtype=dtype), torch.bfloat16)
    gc.collect()
    baseline = _status_kib("VmRSS")
    Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current RSS
    model = _load(cls, folder, dtype, quantization, load_then_quantize)
    peak, steady = _status_kib("VmHWM"), _status_kib("VmRSS")
    held = sum(t.nbytes for t in (*model.parameters(), *model.buffers()))
    dtype_bytes = torch.empty((), dtype=dtype).element_size()
    plan = footprints(folder, dtype_bytes)[stage].weight_bytes(dtype_bytes, quantization == "int8", device="cpu")
    return {"stage": stage, "quantization": quantization, "dtype": str(dtype).removeprefix("torch."),
            "load_then_quantize": load_then_quantize, "peak_bytes": (peak - baseline) * 1024,
            "steady_bytes": (steady - baseline) * 1024, "tensor_bytes": held, "plan_weight_bytes": plan}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="checkpoint folder, or an embedded name (tiny, medium, slice)")
    parser.add_argument("--stage", choices=["thinker", "talker"], default="thinker")
    parser.add_argument("--quantization", choices=["none", "int8"], default="none")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="float32")
    parser.add_argument("--load-then-quantize", action="store_true",
                        help="load in full precision, then quantize (the old way), for comparison")
    args = parser.parse_args(argv)
    from omnistage.families.registry import resolve_model

    folder = resolve_model(args.model)
    print(json.dumps(measure(folder, args.stage, args.quantization, DTYPES[args.dtype], args.load_then_quantize)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
