"""CSM's cost per frame step at a checkpoint's real size, load-robust: the CPU seconds (and wall seconds) one
backbone step plus its 31 depth-decoder passes take at batch 1 and 4 on one thread (the preset's even share of a
2-core machine), and the bytes of weights a step reads, the real-time roofline against memory bandwidth.

    python scripts/csm_step_cost.py /tmp/csm-full int8     # or bf16, fp32; optional: steps timed (default 6)

Prints one JSON line. CPU seconds per step divided by the audio a step makes (80 ms a stream) is the RTF the
backbone stage would reach with a core to itself.
"""

from __future__ import annotations

import json
import resource
import sys
import time

import torch
from torch import nn

from omnistage.families.csm.checkpoint import load_model
from omnistage.families.csm.config import CsmConfig
from omnistage.families.csm.prompt import CsmTokenizer
from omnistage.families.csm.runner import CsmRunner
from omnistage.sampling_params import SamplingParams

FRAME_S = 0.08


def weight_bytes(module: nn.Module) -> int:
    """Parameters and int8 scales: what a pass through ``module`` reads."""
    scales = sum(b.numel() * b.element_size() for n, b in module.named_buffers() if n.endswith("scale"))
    return sum(p.numel() * p.element_size() for p in module.parameters()) + scales


def step_cost(runner: CsmRunner, tokenizer: CsmTokenizer, batch: int, steps: int) -> dict[str, float]:
    for i in range(batch):
        runner.add(f"r{i}", tokenizer.prompt(f"hello there number {i}, how are you today?"),
                   SamplingParams(temperature=0.9, top_k=50, seed=i, max_tokens=steps + 2))
    runner.step()  # the prefills
    runner.step()
    wall, cpu = time.perf_counter(), time.process_time()
    for _ in range(steps):
        runner.step()
    wall, cpu = (time.perf_counter() - wall) / steps, (time.process_time() - cpu) / steps
    runner.running.clear()
    return {"wall_s_per_step": round(wall, 3), "cpu_s_per_step": round(cpu, 3),
            "cpu_rtf": round(cpu / (batch * FRAME_S), 2)}


def main(folder: str, mode: str, steps: int = 6) -> dict[str, object]:
    torch.set_num_threads(1)
    cfg = CsmConfig.from_folder(folder)
    began = time.perf_counter()
    model = load_model(folder, cfg, dtype=torch.bfloat16 if mode == "bf16" else torch.float32,
                       quantization="int8" if mode == "int8" else "none")
    depth = model.depth_decoder
    per_pass = weight_bytes(depth.model.layers) + weight_bytes(depth.model.inputs_embeds_projector)
    step = weight_bytes(model.backbone_model.layers) + (cfg.num_codebooks - 1) * per_pass \
        + weight_bytes(depth.codebooks_head) + weight_bytes(model.lm_head)
    out: dict[str, object] = {"mode": mode, "load_s": round(time.perf_counter() - began, 1),
                              "bytes_per_step_gb": round(step / 1e9, 2), "depth_pass_gb": round(per_pass / 1e9, 3)}
    runner, tokenizer = CsmRunner(model), CsmTokenizer(folder, cfg)
    for batch in (1, 4):
        out[f"batch{batch}"] = step_cost(runner, tokenizer, batch, steps)
    out["peak_rss_gb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6, 2)
    return out


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1], sys.argv[2], *(int(a) for a in sys.argv[3:]))))
