"""CUDA-graph check of the thinker's text decoder at Qwen3-Omni-30B-A3B sizes, random weights, one GPU.

1. Builds the MoE text decoder (48 layers, hidden 2048, 128 experts top-8, GQA 32/4 heads of 128) directly on
   the GPU in bf16 from random weights (no checkpoint), halving the layer count until it fits.
2. Parity: the same greedy requests through an eager runner and a CUDA-graph runner (``runner/cuda_graph.py``):
   first decode step's logits compared, greedy tokens compared.
3. Decode step time at batch 1 and 16, eager and graphs, and the HBM-bandwidth bound of that step
   (bytes of weights a decode step must read — attention, the experts its tokens route to, norms, head — plus
   its KV cache, over the device-to-device copy bandwidth measured here).

``--tiny`` runs the same code on a few-layer toy config (CPU: eager only, graphs skipped) as a sanity run.
Exit 0: parity holds (or no CUDA: message, nothing measured); 1: parity fails.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import torch
from torch import nn

from omnistage.engine import EngineConfig, EngineCore, Request, SamplingParams
from omnistage.models.decoder import DecoderConfig, MoeConfig
from omnistage.models.qwen3_omni.thinker import ThinkerTextModel
from omnistage.runner.ar_runner import ARModelRunner

REAL = dict(hidden_size=2048, num_layers=48, num_heads=32, num_kv_heads=4, head_dim=128, intermediate_size=768,
            experts=128, top_k=8, moe_intermediate=768, vocab=152064)
TINY = dict(hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16, intermediate_size=64,
            experts=8, top_k=2, moe_intermediate=32, vocab=512)


def decoder_cfg(s: dict) -> DecoderConfig:
    return DecoderConfig(
        hidden_size=s["hidden_size"], num_layers=s["num_layers"], num_heads=s["num_heads"],
        num_kv_heads=s["num_kv_heads"], head_dim=s["head_dim"], intermediate_size=s["intermediate_size"],
        rms_norm_eps=1e-6, rope_theta=1e6, mrope_section=None,
        moe=MoeConfig(s["experts"], s["top_k"], s["moe_intermediate"], norm_topk_prob=True),
        sparse_layers=(True,) * s["num_layers"],
    )


class TextLM(nn.Module):
    """The thinker's text decoder + LM head as an ``ARModel`` (1-D RoPE: text-only decode)."""

    uses_mrope = False

    def __init__(self, cfg: DecoderConfig, vocab: int) -> None:
        super().__init__()
        self.cfg = cfg
        self.decoder = ThinkerTextModel(cfg, vocab)
        self.lm_head = nn.Linear(cfg.hidden_size, vocab, bias=False)

    def embed_tokens(self, ids: torch.Tensor) -> torch.Tensor:
        return self.decoder.embed_tokens(ids)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                inputs_embeds: torch.Tensor | None = None) -> torch.Tensor:
        embeds = self.embed_tokens(input_ids) if inputs_embeds is None else inputs_embeds
        return self.decoder(embeds, positions)[0]

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden)

    def kv_cache_spec(self) -> tuple[int, int, int]:
        return tuple(self.cfg.kv_cache_spec())


@torch.no_grad()
def build(sizes: dict, device: str, dtype: torch.dtype) -> TextLM:
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = TextLM(decoder_cfg(sizes), sizes["vocab"])
    finally:
        torch.set_default_dtype(previous)
    gen = torch.Generator(device=device).manual_seed(0)
    for p in model.parameters():  # fused experts may be torch.empty: draw everything
        if p.dim() >= 2:
            p.normal_(0.0, 0.02, generator=gen)
        else:
            p.fill_(1.0)
    return model.eval()


def fit_sizes(device: str, dtype: torch.dtype, sizes: dict) -> tuple[TextLM, dict]:
    while True:
        try:
            return build(sizes, device, dtype), sizes
        except torch.OutOfMemoryError:
            if sizes["num_layers"] <= 1:
                raise
            torch.cuda.empty_cache()
            sizes = dict(sizes, num_layers=sizes["num_layers"] // 2)
            print(f"out of memory; retrying with {sizes['num_layers']} layers", flush=True)


def engine(model: TextLM, device: str, dtype: torch.dtype, eager: bool, max_batch: int, max_len: int) -> EngineCore:
    blocks = max_batch * (-(-max_len // 16)) + 8
    config = EngineConfig(block_size=16, num_blocks=blocks, max_num_seqs=max_batch,
                          max_num_batched_tokens=max(max_batch * 64, 256), max_model_len=max_len,
                          enable_prefix_caching=False, device=device, dtype=dtype, enforce_eager=eager,
                          cuda_graph_max_batch=max_batch)
    return EngineCore(ARModelRunner(model, config), config)


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def decode_step_ms(core: EngineCore, batch: int, vocab: int, device: str, prompt_len: int = 32,
                   steps: int = 20) -> float:
    """Median wall ms of one decode step with ``batch`` running requests (after their prefill)."""
    gen = torch.Generator().manual_seed(batch)
    params = SamplingParams(temperature=0.0, max_tokens=steps + 8, ignore_eos=True)
    for i in range(batch):
        core.add_request(Request(f"r{batch}-{i}-{time.monotonic_ns()}",
                                 torch.randint(0, vocab, (prompt_len,), generator=gen).tolist(), params))
    core.step()  # prefill (all prompts fit one step's budget)
    for _ in range(3):
        core.step()
    times = []
    for _ in range(steps):
        _sync(device)
        t = time.perf_counter()
        core.step()
        _sync(device)
        times.append(time.perf_counter() - t)
    core.run_until_done()
    return 1000.0 * sorted(times)[len(times) // 2]


def greedy(core: EngineCore, prompts: list[list[int]], n: int) -> dict[str, list[int]]:
    params = SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True)
    for i, p in enumerate(prompts):
        core.add_request(Request(f"p{i}", p, params))
    tokens: dict[str, list[int]] = {}
    for out in core.run_until_done():
        tokens.setdefault(out.request_id, []).extend(out.new_token_ids)
    return tokens


def parity(model: TextLM, sizes: dict, device: str, dtype: torch.dtype, batch: int = 4, n: int = 16) -> dict:
    gen = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, sizes["vocab"], (24,), generator=gen).tolist() for _ in range(batch)]
    eager = greedy(engine(model, device, dtype, True, 16, 256), prompts, n)
    graphs_core = engine(model, device, dtype, False, 16, 256)
    captured = graphs_core.runner.graphs is not None
    graphs = greedy(graphs_core, prompts, n)
    same = sum(a == b for k in eager for a, b in zip(eager[k], graphs[k]))
    total = sum(len(v) for v in eager.values())
    # Logits of one decode step through both paths on the same state.
    runner = graphs_core.runner
    diff = None
    if captured:
        from omnistage.layers.attention.context import ForwardContext, forward_context

        core = graphs_core
        params = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
        core.add_request(Request("lg", prompts[0], params))
        core.step()  # prefill
        sched = core.scheduler.schedule()
        inputs = runner.batch.prepare(sched)
        with torch.inference_mode():
            via_graph = runner.graphs.run(inputs, None).float().clone()
            with forward_context(ForwardContext(inputs.meta, runner.backend, runner.kv_caches)):
                via_eager = model(inputs.input_ids, inputs.positions).float()
        lg, le = model.compute_logits(via_graph.to(dtype)).float(), model.compute_logits(via_eager.to(dtype)).float()
        diff = float((lg - le).abs().max() / le.abs().max().clamp_min(1e-6))
    return {"captured": captured, "token_match": same / max(total, 1), "rel_logit_diff": diff}


def bandwidth_gbs(device: str) -> float:
    x = torch.empty(1 << 28, dtype=torch.uint8, device=device)  # 256 MiB
    y = torch.empty_like(x)
    for _ in range(3):
        y.copy_(x)
    _sync(device)
    t = time.perf_counter()
    for _ in range(10):
        y.copy_(x)
    _sync(device)
    return 2 * x.numel() * 10 / (time.perf_counter() - t) / 1e9  # read + write


def step_bytes(s: dict, batch: int, context: int, elem: int) -> float:
    """Bytes a decode step must read: per layer attention + routed experts + router, embeddings rows, head, KV."""
    h, L = s["hidden_size"], s["num_layers"]
    attn = h * (s["num_heads"] + 2 * s["num_kv_heads"]) * s["head_dim"] + s["num_heads"] * s["head_dim"] * h
    expert = 3 * h * s["moe_intermediate"]
    touched = s["experts"] * (1 - (1 - s["top_k"] / s["experts"]) ** batch)  # expected distinct experts
    per_layer = attn + touched * expert + h * s["experts"]
    kv = 2 * L * s["num_kv_heads"] * s["head_dim"] * context * batch
    return elem * (L * per_layer + s["vocab"] * h + batch * h + kv)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tiny", action="store_true", help="toy sizes; runs on CPU (eager parts only)")
    ap.add_argument("--layers", type=int, default=None, help="override the layer count")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    cuda = torch.cuda.is_available()
    if not cuda and not args.tiny:
        print("gpu_check: CUDA is not available here; nothing to measure (use --tiny for a CPU sanity run)")
        return 0
    device, dtype = ("cuda", torch.bfloat16) if cuda else ("cpu", torch.float32)
    sizes = dict(TINY if args.tiny else REAL)
    if args.layers:
        sizes["num_layers"] = args.layers
    t0 = time.perf_counter()
    model, sizes = fit_sizes(device, dtype, sizes)
    params = sum(p.numel() for p in model.parameters())
    print(f"built {params / 1e9:.2f} B params ({sizes['num_layers']} layers) on {device} "
          f"in {time.perf_counter() - t0:.1f} s", flush=True)
    report: dict = {"sizes": sizes, "params": params, "device": device}
    ok = True
    report["parity"] = par = parity(model, sizes, device, dtype)
    if cuda:
        ok = par["captured"] and par["rel_logit_diff"] is not None and par["rel_logit_diff"] < 2e-2
        print(f"parity: graphs captured={par['captured']} greedy token match={par['token_match']:.3f} "
              f"rel logit diff={par['rel_logit_diff']} -> {'OK' if ok else 'FAIL'}", flush=True)
        report["hbm_gbs"] = bw = bandwidth_gbs(device)
        print(f"measured copy bandwidth: {bw:.0f} GB/s", flush=True)
    elem = torch.finfo(dtype).bits // 8
    rows = []
    for batch in (1, 16):
        row = {"batch": batch}
        for mode in ("eager", "graphs") if cuda else ("eager",):
            core = engine(model, device, dtype, mode == "eager", 16, 256)
            row[f"{mode}_ms"] = decode_step_ms(core, batch, sizes["vocab"], device)
            del core
        if cuda:
            row["bound_ms"] = 1000.0 * step_bytes(sizes, batch, 48, elem) / (report["hbm_gbs"] * 1e9)
        rows.append(row)
        print("decode step batch {batch:>2}: ".format(**row)
              + "  ".join(f"{k}={v:.3f}" for k, v in row.items() if k != "batch"), flush=True)
    report["decode"] = rows
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)
    print(f"done in {time.perf_counter() - t0:.1f} s")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
