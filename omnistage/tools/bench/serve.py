"""``omnistage bench serve``: streaming text+audio under bounded concurrency, optionally against transformers.

Two drivers, same prompts and figures:

* in-process (default): starts the pipeline (``AsyncOmni``, every stage in its own process as ``serve`` runs
  it) and streams requests straight into it; fixed lengths come from ``SamplingParams.ignore_eos`` and a
  talker held to exactly ``--audio-frames`` frames (stage max = min new tokens).
* ``--url http://HOST:PORT``: a running ``omnistage serve``; streams ``/v1/chat/completions`` (SSE). The
  OpenAI API has no ``ignore_eos``, so lengths are whatever the model makes (bounded by ``max_tokens``);
  start the server with ``--talker-min-new-tokens`` for a random checkpoint to make audio at all.

Per concurrency level ``num_prompts`` requests run with at most ``c`` in flight. Metrics are named as
``vllm bench serve --omni`` names them (ttft, tpot, itl, e2el, audio_ttfp, audio_rtf; mean/median/p99).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import dataclasses
import json
import random
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import msgspec

from omnistage.tools.bench.metrics import StreamRecord, summarize


@dataclass(frozen=True)
class BenchPrompt:
    token_ids: list[int]
    text: str


def random_prompts(processor, count: int, input_len: int, seed: int) -> list[BenchPrompt]:  # noqa: ANN001
    """vLLM's ``random`` dataset: ``input_len`` random ordinary tokens, decoded to text, in a user turn."""
    tok = processor.tokenizer
    rng = random.Random(seed)
    specials = set(tok.all_special_ids)
    ordinary = [i for i in range(min(len(tok), 1 << 16)) if i not in specials]
    ordinary = [i for i in ordinary if i < min(specials, default=len(tok))]
    prompts = []
    for _ in range(count):
        text = tok.decode([rng.choice(ordinary) for _ in range(input_len)])
        ids = processor.apply_chat_template([{"role": "user", "content": text}])
        prompts.append(BenchPrompt(ids, text))
    return prompts


# ---------------------------------------------------------------------------------------------- drivers

def pinned_spec(spec, audio_frames: int, scheduling: str | None = None,  # noqa: ANN001, ANN201
                code2wav_max_batch: int | None = None):
    """The stage config with the talker held to ``audio_frames`` frames and, optionally, every stage's
    scheduling policy and code2wav's batch cap replaced (to load code2wav at a given concurrency)."""
    stages = []
    for s in spec.stages:
        engine = s.engine
        if scheduling is not None:
            engine = dataclasses.replace(engine, scheduling=scheduling)
        if code2wav_max_batch is not None and s.kind == "generation":
            engine = dataclasses.replace(engine, max_num_seqs=code2wav_max_batch)
        sampling = msgspec.structs.replace(s.sampling, max_tokens=audio_frames) if s.name == "talker" else s.sampling
        stages.append(dataclasses.replace(s, engine=engine, sampling=sampling))
    return dataclasses.replace(spec, stages=tuple(stages))


class InProcessDriver:
    """Streams straight into ``AsyncOmni`` (fixed lengths via ``ignore_eos`` and a pinned talker length)."""

    def __init__(self, model: str, output_tokens: int, audio_frames: int, ignore_eos: bool,
                 stage_config: str | None = None, initial_chunk_frames: int | None = None,
                 scheduling: str | None = None, code2wav_max_batch: int | None = None) -> None:
        from omnistage.config.pipeline import load_pipeline, load_preset
        from omnistage.pipeline.async_omni import AsyncOmni
        from omnistage.pipeline.engine import preset_for
        from omnistage.pipeline.runtime import PipelineOptions
        from omnistage.tools.make_tiny import resolve_model

        base = load_pipeline(stage_config) if stage_config else load_preset(preset_for(resolve_model(model)))
        spec = pinned_spec(base, audio_frames, scheduling, code2wav_max_batch)
        self.omni = AsyncOmni(model, spec, PipelineOptions(talker_min_new_tokens=audio_frames))
        self.processor = self.omni.processor
        self.output_tokens, self.ignore_eos = output_tokens, ignore_eos
        self.initial_chunk_frames = initial_chunk_frames

    async def stream(self, prompt: BenchPrompt, seed: int) -> StreamRecord:
        from omnistage.core import Modality, OmniRequest
        from omnistage.sampling_params import SamplingParams

        request = OmniRequest(  # the served family's prompt (a text prompt: nothing to expand)
            f"bench-{uuid.uuid4().hex[:8]}", self.processor.process(list(prompt.token_ids)),
            frozenset({Modality.TEXT, Modality.AUDIO}),
            SamplingParams(temperature=0.0, max_tokens=self.output_tokens, seed=seed, ignore_eos=self.ignore_eos),
            initial_codec_chunk_frames=self.initial_chunk_frames,
        )
        record = StreamRecord(time.perf_counter())
        async for out in self.omni.generate(request):
            now = time.perf_counter()
            record.add_tokens(now, len(out.token_ids))
            if out.audio is not None:
                record.add_audio(now, int(out.audio.shape[0]))
            if out.finished:
                record.end = now
                if out.error:
                    record.error = out.error
        return record

    async def close(self) -> None:
        await self.omni.shutdown()


async def sse_record(client, url: str, body: dict, consume: Callable[[StreamRecord, dict, float], None],  # noqa: ANN001
                     ) -> StreamRecord:
    """POSTs ``body`` and feeds each SSE ``data:`` event to ``consume`` until ``[DONE]`` or the stream ends; a failed
    request is a figure (its error), not a crash."""
    record = StreamRecord(time.perf_counter())
    try:
        async with client.stream("POST", url, json=body) as resp:
            if resp.status_code != 200:
                record.error = f"HTTP {resp.status_code}: {(await resp.aread())[:200]!r}"
                return record
            async for line in resp.aiter_lines():
                if not line.startswith("data: "):
                    continue
                now = time.perf_counter()
                if line[6:] == "[DONE]":
                    record.end = now
                    break
                consume(record, json.loads(line[6:]), now)
    except Exception as exc:  # noqa: BLE001 - a failed request is a figure, not a crash
        record.error = f"{type(exc).__name__}: {exc}"
    return record


class HttpDriver:
    """Streams ``/v1/chat/completions`` of a running server (SSE, PCM16 audio deltas)."""

    def __init__(self, url: str, model_name: str, output_tokens: int, transport=None) -> None:  # noqa: ANN001
        import httpx

        self.url = url.rstrip("/") + "/v1/chat/completions"
        self.model_name, self.output_tokens = model_name, output_tokens
        self.client = httpx.AsyncClient(timeout=httpx.Timeout(600.0), transport=transport)

    async def stream(self, prompt: BenchPrompt, seed: int) -> StreamRecord:
        body = {"model": self.model_name, "messages": [{"role": "user", "content": prompt.text}],
                "modalities": ["text", "audio"], "audio": {"voice": "Ethan", "format": "pcm16"},
                "max_tokens": self.output_tokens, "temperature": 0.0, "seed": seed, "stream": True}
        return await sse_record(self.client, self.url, body, self._consume)

    @staticmethod
    def _consume(record: StreamRecord, chunk: dict, now: float) -> None:
        for choice in chunk.get("choices") or ():
            delta = choice.get("delta") or {}
            if delta.get("content"):
                record.add_tokens(now, 1)  # one SSE text delta per token batch; counted as one
            audio = delta.get("audio") or {}
            if audio.get("data"):
                record.add_audio(now, len(base64.b64decode(audio["data"])) // 2)

    async def close(self) -> None:
        await self.client.aclose()


# ---------------------------------------------------------------------------------------------- runs

async def run_level(driver, prompts: list[BenchPrompt], concurrency: int, seed: int,  # noqa: ANN001
                    on_done: Callable[[], None] = lambda: None) -> tuple[list[StreamRecord], float]:
    """All ``prompts`` with at most ``concurrency`` in flight; returns the records and the wall time."""
    gate = asyncio.Semaphore(concurrency)

    async def one(i: int, prompt: BenchPrompt) -> StreamRecord:
        async with gate:
            record = await driver.stream(prompt, seed + i)
        on_done()
        return record

    start = time.perf_counter()
    records = await asyncio.gather(*(one(i, p) for i, p in enumerate(prompts)))
    return list(records), time.perf_counter() - start


def _progress(total: int, desc: str):  # noqa: ANN202
    try:
        from tqdm import tqdm

        return tqdm(total=total, desc=desc, file=sys.stderr, leave=False)
    except ImportError:
        return None


async def bench_levels(driver, prompts: list[BenchPrompt], levels: list[int], seed: int,  # noqa: ANN001
                       warmup: int = 1, progress: bool = True) -> dict[int, dict[str, float]]:
    if warmup:
        await run_level(driver, prompts[:warmup], warmup, seed)
    results = {}
    for c in levels:
        bar = _progress(len(prompts), f"concurrency {c}") if progress else None
        records, wall = await run_level(driver, prompts, c, seed, (lambda: bar.update(1)) if bar else (lambda: None))
        if bar is not None:
            bar.close()
        results[c] = summarize(records, wall)
    return results


def run_hf(folder: Path, prompts: list[BenchPrompt], output_tokens: int, audio_frames: int, seed: int,
           num: int, progress: bool = True) -> dict[str, float]:
    from omnistage.tools.bench.hf_baseline import HFBaseline, summarize_hf

    hf = HFBaseline(folder)
    hf.run(prompts[0].token_ids, 2, 2, seed)  # warm-up
    bar = _progress(num, "hf baseline") if progress else None
    results = []
    for i, prompt in enumerate(prompts[:num]):
        results.append(hf.run(prompt.token_ids, output_tokens, audio_frames, seed + i))
        if bar is not None:
            bar.update(1)
    if bar is not None:
        bar.close()
    return summarize_hf(results)


def add_ratios(levels: dict[int, dict[str, float]], hf: dict[str, float]) -> None:
    """Ratios against HF's best request (its fastest e2e, its best audio s/s), so noise never flatters us."""
    audio = hf.get("best_audio_throughput", hf.get("audio_throughput"))
    e2el = hf.get("min_e2el_ms", hf.get("mean_e2el_ms"))
    for fig in levels.values():
        if audio:
            fig["audio_throughput_ratio_vs_hf"] = fig["audio_throughput"] / audio
        if "mean_audio_ttfp_ms" in fig and e2el:
            fig["ttfp_ratio_vs_hf_e2e"] = fig["mean_audio_ttfp_ms"] / e2el


def print_table(levels: dict[int, dict[str, float]], hf: dict[str, float] | None) -> None:
    head = (f"{'conc':>4} {'ttft p50':>9} {'ttfp p50':>9} {'e2el p50':>9} {'e2el p90':>9} {'e2el p99':>9} "
            f"{'tok/s':>8} {'audio s/s':>9} {'rtf':>6} {'underrun':>9} {'stall ms':>8}")
    if hf:
        head += f" {'audio x hf':>10} {'ttfp/hf e2e':>11}"
    print(head)
    for c, f in levels.items():
        line = (f"{c:>4} {f.get('median_ttft_ms', 0):>9.1f} {f.get('median_audio_ttfp_ms', 0):>9.1f} "
                f"{f.get('p50_e2el_ms', 0):>9.1f} {f.get('p90_e2el_ms', 0):>9.1f} {f.get('p99_e2el_ms', 0):>9.1f} "
                f"{f['output_throughput']:>8.1f} {f['audio_throughput']:>9.3f} {f.get('mean_audio_rtf', 0):>6.2f} "
                f"{int(f['underrun_streams']):>4}/{int(f['audio_streams']):<4} {f.get('mean_underrun_ms', 0):>8.1f}")
        if hf:
            line += (f" {f.get('audio_throughput_ratio_vs_hf', 0):>10.2f} "
                     f"{f.get('ttfp_ratio_vs_hf_e2e', 0):>11.3f}")
        print(line)
    if hf:
        print(f"  hf: {hf['completed']} requests one at a time, e2e mean {hf['mean_e2el_ms']:.1f} ms "
              f"(best {hf['min_e2el_ms']:.1f} ms, best {hf['best_audio_throughput']:.3f} audio s/s; ratios use the best), "
              f"{hf['output_throughput']:.1f} tok/s, {hf['audio_throughput']:.3f} audio s/s "
              f"({hf['mean_audio_s']:.2f} s audio each)")


def compare_policies(runs: dict[str, dict[int, dict[str, float]]]) -> dict[str, dict[str, dict[str, float]]]:
    """Runs of the same policy (``fifo``, ``fifo#2`` ...) pooled per concurrency: streams that underran, mean
    stall per stream, audio throughput. Alternating policies (fifo,deadline,fifo,deadline) spreads the drift of
    a shared machine over both, so the comparison is of policies rather than of moments."""
    pooled: dict[str, dict[str, dict[str, float]]] = {}
    for name, levels in runs.items():
        policy = name.split("#")[0]
        for c, f in levels.items():
            acc = pooled.setdefault(policy, {}).setdefault(str(c), {"runs": 0, "underrun_streams": 0,
                                                                     "audio_streams": 0, "stall_s": 0.0,
                                                                     "audio_s": 0.0, "wall_s": 0.0})
            acc["runs"] += 1
            acc["underrun_streams"] += f["underrun_streams"]
            acc["audio_streams"] += f["audio_streams"]
            acc["stall_s"] += f.get("total_underrun_s", 0.0)
            acc["audio_s"] += f["total_audio_s"]
            acc["wall_s"] += f["duration_s"]
    for levels in pooled.values():
        for acc in levels.values():
            acc["mean_underrun_ms"] = 1000.0 * acc["stall_s"] / max(acc["audio_streams"], 1)
            acc["audio_throughput"] = acc["audio_s"] / acc["wall_s"] if acc["wall_s"] else 0.0
    print("policies pooled over their runs:")
    for policy, levels in pooled.items():
        for c, acc in levels.items():
            print(f"  {policy:>8} c={c:<3} runs {int(acc['runs'])}: underran {int(acc['underrun_streams'])}/"
                  f"{int(acc['audio_streams'])} streams, mean stall {acc['mean_underrun_ms']:.1f} ms/stream, "
                  f"{acc['audio_throughput']:.3f} audio s/s")
    return pooled


def plot(levels: dict[int, dict[str, float]], path: str) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print(f"--plot {path}: matplotlib is not installed (pip install matplotlib); no plot written",
              file=sys.stderr)
        return False
    xs = list(levels)
    fig, ax = plt.subplots(figsize=(6, 4))
    for key, label in (("p50_e2el_ms", "e2el p50"), ("p99_e2el_ms", "e2el p99"),
                       ("median_audio_ttfp_ms", "audio ttfp p50"), ("median_ttft_ms", "ttft p50")):
        ax.plot(xs, [levels[c].get(key, float("nan")) for c in xs], marker="o", label=label)
    ax.set_xscale("log", base=2)
    ax.set_xticks(xs, [str(c) for c in xs])  # the levels run, not powers of two
    ax.set_xlabel("concurrency")
    ax.set_ylabel("ms")
    ax.legend()
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    return True


async def _drive(args: argparse.Namespace, prompts: list[BenchPrompt], driver) -> dict[int, dict[str, float]]:  # noqa: ANN001
    try:
        return await bench_levels(driver, prompts, args.concurrency, args.seed, args.warmup, not args.no_progress)
    finally:
        await driver.close()


def main(args: argparse.Namespace) -> int:
    from omnistage.families.registry import DEFAULT_REGISTRY
    from omnistage.tools.make_tiny import resolve_model

    if getattr(args, "backend", "openai-chat") == "openai-audio-speech":
        from omnistage.tools.bench.speech import speech_main

        return speech_main(args)
    folder = resolve_model(args.model)
    output_tokens = args.random_output_len or args.output_tokens
    frames = args.audio_frames or output_tokens
    family = DEFAULT_REGISTRY.for_folder(folder)  # any family with a chat front end
    processor = family.front_end(folder, family.load_config(folder)).processor
    if processor is None:
        raise SystemExit(f"omnistage bench serve: {args.model} takes no chat (--backend openai-audio-speech)")
    prompts = random_prompts(processor, args.num_prompts, args.random_input_len, args.seed)
    policies = [None] if args.url or not args.scheduling else args.scheduling
    runs: dict[str, dict[int, dict[str, float]]] = {}
    for policy in policies:
        if args.url:
            driver = HttpDriver(args.url, args.served_model or args.model, output_tokens)
        else:
            driver = InProcessDriver(args.model, output_tokens, frames, args.ignore_eos, args.stage_config,
                                     args.initial_chunk_frames, policy, args.code2wav_max_batch)
        name = policy or "default"
        name = name if name not in runs else f"{name}#{sum(k.split('#')[0] == name for k in runs) + 1}"
        runs[name] = asyncio.run(_drive(args, prompts, driver))
    hf = None
    if args.baseline == "hf":
        hf = run_hf(folder, prompts, output_tokens, frames, args.seed, args.hf_num_prompts or min(args.num_prompts, 4),
                    not args.no_progress)
    for name, levels in runs.items():
        if hf:
            add_ratios(levels, hf)
        print(f"scheduling: {name}")
        print_table(levels, hf)
    first = next(iter(runs.values()))
    pooled = compare_policies(runs) if len(runs) > 1 else None
    if args.plot:
        plot(first, args.plot)
    if args.json_out:
        payload = {"model": str(args.model), "driver": "http" if args.url else "in-process",
                   "num_prompts": args.num_prompts, "input_len": args.random_input_len,
                   "output_tokens": output_tokens, "audio_frames": frames, "ignore_eos": args.ignore_eos,
                   "code2wav_max_batch": args.code2wav_max_batch,
                   "concurrency": {str(c): f for c, f in first.items()}, "hf_baseline": hf}
        if len(runs) > 1:
            payload["scheduling"] = {name: {str(c): f for c, f in levels.items()} for name, levels in runs.items()}
            payload["scheduling_pooled"] = pooled
        Path(args.json_out).write_text(json.dumps(payload, indent=2))
    return 0
