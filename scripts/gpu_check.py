"""The steps of scripts/gpu_check.sh, one subcommand each; every figure lands in one JSON (scripts/gpu_report.py).

* ``smoke`` (20 s): imports, a tiny thinker decoder's forward on the device through the runner (on CUDA: Triton
  paged attention and fused MoE, and its decode CUDA graph captured), one Triton kernel against torch, the
  versions and ``nvidia-smi``'s line. Fails fast: the shell stops the run when it does.
* ``parity``: each Triton kernel against its torch path (scripts/gpu_parity.py): bf16 at real widths on CUDA.
* ``measure``: one process builds each stage once in memory from random weights on the device
  (scripts/gpu_models.py): the thinker's text decoder at Qwen3-Omni-30B-A3B's widths and depth, then the talker
  with its code predictor. Per stage: CUDA graphs vs eager (parity of greedy tokens and logits, decode step
  times) and ``bench roofline``'s figures at batch 1 and 16, each sub-step within its own budget.

``--cpu`` runs the same steps on the CPU at toy sizes (Triton interpreted, fp32, no graphs): a check of the
script, not a measurement. Without CUDA and without ``--cpu``: a message, exit 0.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # `python3 scripts/gpu_check.py` puts scripts/ first, not the repo root
    sys.path.insert(0, str(ROOT))
if "--cpu" in sys.argv:  # Triton reads this when first imported
    os.environ.setdefault("TRITON_INTERPRET", "1")

import torch  # noqa: E402

import gpu_report  # noqa: E402  (scripts/, beside this file)

# In-process budgets (seconds) of the measure step's sub-steps; scripts/gpu_check.sh's table adds them up.
BUDGETS = {"device": 10, "thinker": 170, "talker": 140}


def versions() -> dict:
    import importlib.metadata as md

    found = {"python": sys.version.split()[0], "torch_cuda": torch.version.cuda}
    for name in ("torch", "triton", "transformers", "tokenizers", "safetensors", "numpy", "msgspec", "pyzmq"):
        try:
            found[name] = md.version(name)
        except md.PackageNotFoundError:
            found[name] = None
    return found


def nvidia_smi() -> str:
    query = "--query-gpu=name,memory.total,driver_version,clocks.max.sm,clocks.max.mem"
    try:
        return subprocess.run(["nvidia-smi", query, "--format=csv,noheader"], capture_output=True, text=True,
                              timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError) as exc:
        return f"(nvidia-smi: {exc})"


# ---- smoke -------------------------------------------------------------------------------------------------
def smoke(args: argparse.Namespace, fig: dict) -> None:
    from omnistage.engine import EngineConfig, EngineCore, Request, SamplingParams
    from omnistage.runner.ar_runner import ARModelRunner
    from omnistage.runner.cuda_graph import describe

    import gpu_models
    import gpu_parity

    fig.update(versions=versions(), nvidia_smi=nvidia_smi() if args.device == "cuda" else "(--cpu)",
               device=args.device, dtype=str(args.dtype).removeprefix("torch."))
    if args.device == "cuda":
        fig["gpu"] = torch.cuda.get_device_name()
    print(f"  versions {fig['versions']}; {fig['nvidia_smi']}", flush=True)
    # One Triton kernel against torch: the fused MoE at toy widths (bf16 on CUDA, interpreted fp32 on CPU).
    tol = gpu_parity.BF16_TOL if args.device == "cuda" else gpu_parity.FP32_TOL
    fig["triton_kernel"] = gpu_parity.moe_case("smoke: fused MoE", args.device, args.dtype, 4, 8, 64, 32, 2, tol)
    # A tiny decoder's forward through the runner; on CUDA it captures its decode graph (batch 1).
    model = gpu_models.build_thinker(gpu_models.TINY_THINKER, args.device, args.dtype)
    config = EngineConfig(block_size=16, num_blocks=16, max_num_seqs=1, max_num_batched_tokens=64, max_model_len=64,
                          enable_prefix_caching=False, device=args.device, dtype=args.dtype, cuda_graph_max_batch=1)
    core = EngineCore(ARModelRunner(model, config), config)
    core.add_request(Request("smoke", [1], SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)))
    tokens = [t for out in core.run_until_done() for t in out.new_token_ids]
    fig["forward_tokens"] = tokens
    fig["graphs"] = describe(core.runner.capture_outcomes)
    fig["graphs_captured"] = core.runner.graphs is not None
    print(f"  tiny forward: tokens {tokens}; graphs: {fig['graphs']}", flush=True)
    problems = []
    if not fig["triton_kernel"]["ok"]:
        problems.append("the fused MoE Triton kernel disagrees with torch")
    if len(tokens) != 4:
        problems.append(f"the tiny forward made {len(tokens)} tokens, not 4")
    if args.device == "cuda" and not fig["graphs_captured"]:
        problems.append(f"no CUDA graph captured ({fig['graphs']})")
    fig["ok"], fig["error"] = not problems, "; ".join(problems)


# ---- measure -----------------------------------------------------------------------------------------------
def device_rates(args: argparse.Namespace, fig: dict) -> None:
    from omnistage.tools.bench.roofline import copy_bandwidth, matmul_gflops

    fig["copy_gbps"] = round(copy_bandwidth(args.device), 1)
    fig["matmul_gflops"] = round(matmul_gflops(args.device, args.dtype), 1)
    if args.device == "cuda":
        free, total = torch.cuda.mem_get_info()
        # What this process holds outside torch's allocator now (context, cuBLAS, Triton modules): the figure
        # engine/kv_sizing.py's CUDA_CONTEXT_BYTES stands for.
        fig["outside_torch_bytes"] = (total - free) - torch.cuda.memory_reserved()
        fig["device_total_bytes"] = total
    print(f"  copy {fig['copy_gbps']} GB/s, matmul {fig['matmul_gflops']} GFLOP/s", flush=True)


def graphs_vs_eager(model, vocab: int, args: argparse.Namespace) -> dict:
    """Greedy tokens and one decode step's logits through an eager engine and a graph engine."""
    from omnistage.engine import EngineConfig, EngineCore, Request, SamplingParams
    from omnistage.layers.attention.context import ForwardContext, forward_context
    from omnistage.runner.ar_runner import ARModelRunner
    from omnistage.runner.cuda_graph import describe

    def engine(eager: bool) -> EngineCore:
        config = EngineConfig(block_size=16, num_blocks=16 * 16 + 8, max_num_seqs=16, max_num_batched_tokens=1024,
                              max_model_len=256, enable_prefix_caching=False, device=args.device, dtype=args.dtype,
                              enforce_eager=eager, cuda_graph_max_batch=16)
        return EngineCore(ARModelRunner(model, config), config)

    gen = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, vocab, (24,), generator=gen).tolist() for _ in range(4)]

    def greedy(core: EngineCore) -> dict[str, list[int]]:
        params = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
        for i, p in enumerate(prompts):
            core.add_request(Request(f"p{i}", p, params))
        out: dict[str, list[int]] = {}
        for o in core.run_until_done():
            out.setdefault(o.request_id, []).extend(o.new_token_ids)
        return out

    eager = greedy(engine(True))
    core = engine(False)
    result = {"graphs": describe(core.runner.capture_outcomes), "graphs_captured": core.runner.graphs is not None}
    graphs = greedy(core)
    same = sum(a == b for k in eager for a, b in zip(eager[k], graphs[k]))
    result["token_match"] = same / max(sum(len(v) for v in eager.values()), 1)
    if core.runner.graphs is not None:  # one decode step's logits through the graph and eagerly, same state
        runner = core.runner
        core.add_request(Request("lg", prompts[0], SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)))
        core.step()
        inputs = runner.batch.prepare(core.scheduler.schedule())
        with torch.inference_mode():
            via_graph = runner.graphs.run(inputs, None).clone()
            with forward_context(ForwardContext(inputs.meta, runner.backend, runner.kv_caches)):
                via_eager = model(inputs.input_ids, inputs.positions)
            lg, le = model.compute_logits(via_graph).float(), model.compute_logits(via_eager).float()
        result["rel_logit_diff"] = float((lg - le).abs().max() / le.abs().max().clamp_min(1e-6))
    print(f"  graphs vs eager: {result}", flush=True)
    return result


def roofline(stage, name: str, args: argparse.Namespace, gflops: float) -> list[dict]:
    from dataclasses import asdict

    from omnistage.tools.bench.roofline import measure_stage, roofline_rows

    measured = measure_stage(stage, args.batches, args.steps, 32, args.device, args.dtype)
    rows = [asdict(r) for r in roofline_rows(name, measured, gflops)]
    for r in rows:
        print(f"  {name} batch {r['batch']}: step {r['step_ms']:.3f} ms, floor {r['floor_ms']:.3f} ms "
              f"(ratio {r['floor_ratio']}), compute floor {r['compute_floor_ms']:.3f} ms; graphs: {r['graphs']}",
              flush=True)
    return rows


def measure_thinker(args: argparse.Namespace, fig: dict, gflops: float) -> None:
    import gpu_models

    sizes = dict(gpu_models.REAL_THINKER if args.device == "cuda" else gpu_models.TINY_THINKER)
    if args.thinker_layers:
        sizes["num_layers"] = args.thinker_layers
    t = time.monotonic()
    model = gpu_models.build_thinker(sizes, args.device, args.dtype)
    fig.update(sizes=sizes, param_bytes=gpu_models.param_bytes(model), build_s=round(time.monotonic() - t, 1))
    print(f"  built the thinker decoder: {sizes['num_layers']} layers, {fig['param_bytes'] / 1e9:.1f} GB "
          f"in {fig['build_s']} s", flush=True)
    fig["graphs_vs_eager"] = par = graphs_vs_eager(model, sizes["vocab"], args)
    fig["roofline"] = roofline(gpu_models.thinker_stage(model, sizes["vocab"]), "thinker", args, gflops)
    if args.device == "cuda":
        problems = [] if par["graphs_captured"] else [f"graphs not captured ({par['graphs']})"]
        if par.get("rel_logit_diff") is not None and par["rel_logit_diff"] >= 2e-2:
            problems.append(f"graph logits differ from eager by {par['rel_logit_diff']:.3g}")
        fig["ok"], fig["error"] = not problems, "; ".join(problems)


def measure_talker(args: argparse.Namespace, fig: dict, gflops: float) -> None:
    import gpu_models

    real = args.device == "cuda"
    layers = args.talker_layers or (gpu_models.REAL_TALKER_LAYERS if real else None)
    t = time.monotonic()
    model = gpu_models.build_talker(real, layers, args.device, args.dtype)
    fig.update(layers=model.config.text_config.num_hidden_layers, param_bytes=gpu_models.param_bytes(model),
               build_s=round(time.monotonic() - t, 1))
    print(f"  built the talker: {fig['layers']} layers + code predictor, {fig['param_bytes'] / 1e9:.2f} GB "
          f"in {fig['build_s']} s", flush=True)
    fig["roofline"] = rows = roofline(gpu_models.talker_stage(model, args.device, args.dtype), "talker", args, gflops)
    if real:
        eager = [r["graphs"] for r in rows if "FAILED" in r["graphs"] or "captured" not in r["graphs"]]
        fig["ok"], fig["error"] = not eager, "; ".join(eager)


def measure(args: argparse.Namespace) -> int:
    out = args.json
    with gpu_report.step(out, "device", BUDGETS["device"]) as fig:
        device_rates(args, fig)
    gflops = gpu_report.read(out).get("device", {}).get("matmul_gflops") or 1.0
    with gpu_report.step(out, "thinker", BUDGETS["thinker"]) as fig:
        measure_thinker(args, fig, gflops)
    if args.device == "cuda":
        torch.cuda.empty_cache()
    with gpu_report.step(out, "talker", BUDGETS["talker"]) as fig:
        measure_talker(args, fig, gflops)
    steps = gpu_report.read(out).get("steps", {})
    return 0 if all(steps.get(n, {}).get("status") == "ok" for n in BUDGETS) else 1


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("command", choices=("smoke", "parity", "measure"))
    ap.add_argument("--cpu", action="store_true", help="toy sizes on the CPU (Triton interpreted): checks the script")
    ap.add_argument("--json", required=True, help="the report to update")
    ap.add_argument("--budget", type=int, default=20, help="seconds for smoke or parity (measure: BUDGETS)")
    ap.add_argument("--thinker-layers", type=int, default=None, help="default: 48 on CUDA (the real depth)")
    ap.add_argument("--talker-layers", type=int, default=None, help="default: 20 on CUDA (the real depth)")
    ap.add_argument("--steps", type=int, default=10, help="timed decode steps per batch size")
    ap.add_argument("--batches", type=lambda s: [int(b) for b in s.split(",")], default=[1, 16])
    args = ap.parse_args()
    if not args.cpu and not torch.cuda.is_available():
        print("gpu_check: CUDA is not available here; nothing to measure (--cpu checks the script on the CPU)")
        return 0
    args.device, args.dtype = ("cpu", torch.float32) if args.cpu else ("cuda", torch.bfloat16)
    if args.cpu:
        torch.set_num_threads(min(2, os.cpu_count() or 1))
    if args.command == "measure":
        return measure(args)
    if args.command == "parity":
        import gpu_parity

        with gpu_report.step(args.json, "parity", args.budget) as fig:
            fig.update(gpu_parity.run(args.device))
    else:
        with gpu_report.step(args.json, "smoke", args.budget) as fig:
            smoke(args, fig)
    status = gpu_report.read(args.json).get("steps", {}).get(args.command, {})
    if status.get("status") != "ok":
        print(f"gpu_check: {args.command} {status.get('status')}: {status.get('error')}", flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
