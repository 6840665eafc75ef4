"""One decode step with N running requests: wall time, time inside the model, and the engine's rest.

``python -m omnistage.tools.bench.hotpath --stage talker --batch 16 [--profile]``. The model's own
methods (forward, compute_logits, and the talker's code predictor and frame embedding) are timed by
wrapping them; everything else in ``EngineCore.step`` (scheduling, batch building, sampling, output
bookkeeping) is the engine's non-model time. ``--profile`` prints a pyinstrument tree of the same steps.
"""

from __future__ import annotations

import argparse
import functools
import statistics
import time

import torch

from omnistage.engine import EngineConfig, EngineCore
from omnistage.runner import ARModelRunner
from omnistage.sampling_params import SamplingParams
from omnistage.tools.bench.engine import StageUnderTest, load_stage

MODEL_METHODS = ("forward", "compute_logits", "predict_residual_codes", "frame_embedding", "embed_tokens")


class ModelClock:
    """Wraps the model's methods (as instance attributes) and sums the seconds spent inside them."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.seconds = 0.0
        self._depth = 0
        for name in MODEL_METHODS:
            method = getattr(model, name, None)
            if method is not None:
                setattr(model, name, self._timed(method))

    def _timed(self, fn):  # noqa: ANN001, ANN202
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
            self._depth += 1
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self._depth -= 1
                if self._depth == 0:  # nested calls (forward → embed_tokens) count once
                    self.seconds += time.perf_counter() - start

        return wrapper


def measure(stage: StageUnderTest, batch: int, steps: int = 30, prompt_len: int = 16,
            profile: bool = False) -> dict[str, float]:
    config = EngineConfig(block_size=16, num_blocks=batch * 8 + 8, max_num_seqs=batch,
                          max_num_batched_tokens=max(batch * prompt_len, 256), max_model_len=128,
                          enable_prefix_caching=False)
    clock = ModelClock(stage.model)
    core = EngineCore(ARModelRunner(stage.model, config, hook=stage.make_hook()), config)
    gen = torch.Generator().manual_seed(0)
    params = SamplingParams(temperature=0.9, top_k=50, max_tokens=steps + 12, ignore_eos=True, seed=0)
    for i in range(batch):
        core.add_request(stage.make_request(f"hot-{i}", prompt_len, params, gen))
    for _ in range(6):  # prefill + warm-up decodes
        core.step()
    profiler = None
    if profile:
        from pyinstrument import Profiler

        profiler = Profiler(interval=0.0005)
        profiler.start()
    walls, models = [], []
    for _ in range(steps):
        clock.seconds = 0.0
        start = time.perf_counter()
        core.step()
        walls.append(time.perf_counter() - start)
        models.append(clock.seconds)
    if profiler is not None:
        profiler.stop()
        print(profiler.output_text(unicode=True, color=False, show_all=False))
    rest = [w - m for w, m in zip(walls, models)]
    return {"batch": batch, "step_ms": 1000 * statistics.median(walls), "model_ms": 1000 * statistics.median(models),
            "non_model_ms": 1000 * statistics.median(rest)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--stage", default="talker", choices=["thinker", "talker"])
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--repeats", type=int, default=3, help="runs; the one with least non-model time is reported")
    ap.add_argument("--profile", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(1)
    stage = load_stage(args.model, args.stage, "cpu", torch.float32)
    best = min((measure(stage, args.batch, args.steps, profile=args.profile and r == 0)
                for r in range(args.repeats)), key=lambda r: r["non_model_ms"])
    print(f"{args.stage} decode step, batch {best['batch']}: {best['step_ms']:.2f} ms wall, "
          f"{best['model_ms']:.2f} ms in the model, {best['non_model_ms']:.2f} ms engine (non-model)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
