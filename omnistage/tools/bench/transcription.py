"""``omnistage bench serve --backend openai-audio-transcriptions``: speech recognition under bounded concurrency.

Each request is one clip of ``--audio-seconds`` of voiced-sounding audio (random weights hear no words anyway),
written down in exactly ``--output-tokens`` tokens (``--ignore-eos``). Two drivers, same clips:

* in-process (default): the checkpoint's pipeline (``AsyncOmni``, every stage in its own process as ``serve`` runs
  it, with serve's ``--dtype``, ``--kv-cache-memory`` and ``--quantization``), prompts from the family's
  transcriber (a recogniser: Qwen3-ASR);
* ``--url``: a running ``omnistage serve``, ``POST /v1/audio/transcriptions`` with ``stream=true`` (lengths as the
  model makes them: the API has no ``ignore_eos``).

Per level, beside ``bench serve``'s figures: ``audio_s_per_wall_s`` (seconds of input audio written down per wall
second) and ``p50_rtf`` (a request's latency over its clip's length, median). ``--baseline hf``: transformers'
``Qwen3ASRForConditionalGeneration.generate`` on the same clips, one at a time, at the same fixed length.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from omnistage.tools.bench.levels import BenchPrompt, progress_bar, run_level
from omnistage.tools.bench.metrics import StreamRecord, summarize

RATE = 16000


@dataclass(frozen=True)
class Clip(BenchPrompt):
    audio: np.ndarray | None = None

    @property
    def seconds(self) -> float:
        return 0.0 if self.audio is None else len(self.audio) / RATE


def clips(count: int, seconds: float, seed: int) -> list[Clip]:
    """Voiced-sounding clips (a wandering pitch with harmonics, syllable-rate bursts, a little noise), one per seed."""
    out = []
    for i in range(count):
        rng = np.random.default_rng(seed + i)
        t = np.arange(int(seconds * RATE)) / RATE
        phase = 2 * np.pi * np.cumsum(120 + 60 * rng.random() + 30 * np.sin(2 * np.pi * 0.7 * t)) / RATE
        voiced = sum(np.sin(k * phase) / k for k in range(1, 6)) * (0.5 + 0.5 * np.sin(2 * np.pi * 4 * t) ** 2)
        audio = (0.2 * voiced + 0.01 * rng.standard_normal(t.shape)).astype(np.float32)
        out.append(Clip([], "", audio))
    return out


class TranscribeInProcess:
    def __init__(self, args: argparse.Namespace) -> None:
        from omnistage.pipeline.async_omni import AsyncOmni
        from omnistage.pipeline.engine import OmniPipeline
        from omnistage.pipeline.runtime import PipelineOptions
        from omnistage.pipeline.serve_flags import model_overrides

        pipeline = OmniPipeline(args.model, args.stage_config, PipelineOptions(), overrides=model_overrides(args))
        self.omni = AsyncOmni(pipeline=pipeline)
        self.transcriber = self.omni.front_end.transcriber
        if self.transcriber is None:
            raise SystemExit(f"omnistage bench serve: {args.model} is no speech recogniser "
                             "(--backend openai-audio-transcriptions serves Qwen3-ASR checkpoints)")
        self.output_tokens, self.ignore_eos = args.output_tokens, args.ignore_eos

    async def stream(self, clip: Clip, seed: int) -> StreamRecord:
        from omnistage.core import Modality, OmniRequest
        from omnistage.sampling_params import SamplingParams

        record = StreamRecord(time.perf_counter())
        prompt = await asyncio.to_thread(self.transcriber.transcription_prompt, clip.audio, "en", None)
        request = OmniRequest(f"bench-{uuid.uuid4().hex[:8]}", prompt, frozenset({Modality.TEXT}),
                              SamplingParams(temperature=0.0, max_tokens=self.output_tokens, seed=seed,
                                             ignore_eos=self.ignore_eos))
        async for out in self.omni.generate(request):
            now = time.perf_counter()
            record.add_tokens(now, len(out.token_ids))
            if out.finished:
                record.end, record.error = now, out.error
        return record

    async def close(self) -> None:
        await self.omni.shutdown()


class TranscribeHttp:
    """Streams ``/v1/audio/transcriptions`` of a running server (``stream=true``: transcript.text events)."""

    def __init__(self, url: str, model_name: str) -> None:
        import httpx

        self.url = url.rstrip("/") + "/v1/audio/transcriptions"
        self.model_name = model_name
        self.client = httpx.AsyncClient(timeout=httpx.Timeout(600.0))

    async def stream(self, clip: Clip, seed: int) -> StreamRecord:
        import soundfile as sf

        wav = io.BytesIO()
        sf.write(wav, clip.audio, RATE, format="WAV", subtype="PCM_16")
        record = StreamRecord(time.perf_counter())
        data = {"model": self.model_name, "language": "en", "stream": "true"}
        try:
            async with self.client.stream("POST", self.url, data=data,
                                          files={"file": ("clip.wav", wav.getvalue(), "audio/wav")}) as resp:
                if resp.status_code != 200:
                    record.error = f"HTTP {resp.status_code}: {(await resp.aread())[:200]!r}"
                    return record
                async for line in resp.aiter_lines():
                    if line.startswith("data: "):
                        self._consume(record, json.loads(line[6:]), time.perf_counter())
        except Exception as exc:  # noqa: BLE001 - a failed request is a figure, not a crash
            record.error = f"{type(exc).__name__}: {exc}"
        return record

    @staticmethod
    def _consume(record: StreamRecord, event: dict, now: float) -> None:
        if event.get("type") == "transcript.text.delta":
            record.add_tokens(now, 1)  # one delta per detokenised piece; counted as one
        elif event.get("type") == "transcript.text.done":
            record.end = now
        elif "error" in event:
            record.error = str(event["error"].get("message"))

    async def close(self) -> None:
        await self.client.aclose()


def audio_figures(records: list[StreamRecord], prompts: list[Clip], wall: float) -> dict[str, float]:
    """Input audio written down per wall second, and the median latency over clip length (``p50_rtf``)."""
    done = [(r, p) for r, p in zip(records, prompts) if r.ok]
    audio = sum(p.seconds for _, p in done)
    rtf = [r.e2el / p.seconds for r, p in done if p.seconds > 0]
    return {"total_input_audio_s": audio, "audio_s_per_wall_s": audio / wall if wall > 0 else 0.0,
            "p50_rtf": float(np.median(rtf)) if rtf else 0.0}


async def drive_levels(args: argparse.Namespace, prompts: list[Clip],
                       driver) -> dict[int, dict[str, float]]:  # noqa: ANN001
    """Every level of the flags (after the warm-up), each with :func:`audio_figures`; then the driver closed."""
    try:
        if args.warmup:
            await run_level(driver, prompts[:args.warmup], args.warmup, args.seed)
        levels = {}
        for c in args.concurrency:
            bar = progress_bar(len(prompts), f"concurrency {c}") if not args.no_progress else None
            records, wall = await run_level(driver, prompts, c, args.seed,
                                            (lambda: bar.update(1)) if bar else (lambda: None))
            if bar is not None:
                bar.close()
            levels[c] = {**summarize(records, wall), **audio_figures(records, prompts, wall)}
        return levels
    finally:
        await driver.close()


def run_hf(folder: Path, prompts: list[Clip], output_tokens: int) -> dict[str, float]:
    """transformers' ``generate`` on the same clips, one at a time, exactly ``output_tokens`` each (min = max, as
    ``ignore_eos``); on the GPU in bfloat16 when there is one, else fp32 on the CPU."""
    import torch
    from transformers import Qwen3ASRForConditionalGeneration

    from omnistage.families.qwen3_asr.config import Qwen3ASRCheckpoint
    from omnistage.families.qwen3_asr.prompt import Qwen3ASRPromptProcessor
    from omnistage.families.qwen3_asr.verify import reference_inputs

    device, dtype = ("cuda", torch.bfloat16) if torch.cuda.is_available() else ("cpu", torch.float32)
    ckpt = Qwen3ASRCheckpoint.from_folder(folder)
    model = Qwen3ASRForConditionalGeneration.from_pretrained(folder, dtype=dtype).to(device).eval()
    processor = Qwen3ASRPromptProcessor(folder, int(ckpt.audio.n_window))

    def once(clip: Clip) -> float:
        began = time.perf_counter()
        inputs = reference_inputs(processor, processor.prompt(clip.audio, "en"))  # the request's own preprocessing
        inputs = {k: v.to(device, dtype) if v.is_floating_point() else v.to(device) for k, v in inputs.items()}
        with torch.no_grad():
            model.generate(**inputs, max_new_tokens=output_tokens, min_new_tokens=output_tokens, do_sample=False)
        if device == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - began

    once(prompts[0])  # warm-up
    e2e = [once(p) for p in prompts]
    audio = [p.seconds for p in prompts]
    return {"completed": len(prompts), "mean_e2el_ms": 1000 * sum(e2e) / len(e2e), "min_e2el_ms": 1000 * min(e2e),
            "audio_s_per_wall_s": sum(audio) / sum(e2e),
            "p50_rtf": float(np.median([t / a for t, a in zip(e2e, audio)])),
            "output_throughput": len(prompts) * output_tokens / sum(e2e)}


def print_levels(levels: dict[int, dict[str, float]], hf: dict[str, float] | None) -> None:
    print(f"{'conc':>4} {'e2el p50':>9} {'e2el p99':>9} {'tok/s':>8} {'audio s/s':>9} {'p50 rtf':>8}"
          + (f" {'x hf':>6}" if hf else ""))
    for c, f in levels.items():
        line = (f"{c:>4} {f.get('p50_e2el_ms', 0):>9.1f} {f.get('p99_e2el_ms', 0):>9.1f} "
                f"{f['output_throughput']:>8.1f} {f['audio_s_per_wall_s']:>9.2f} {f['p50_rtf']:>8.4f}")
        if hf:
            line += f" {f['audio_s_per_wall_s'] / hf['audio_s_per_wall_s']:>6.2f}"
        print(line + (f"  ({int(f['failed'])} failed)" if f["failed"] else ""))
    if hf:
        print(f"  hf: {hf['completed']} clips one at a time, {hf['audio_s_per_wall_s']:.2f} audio s/s, p50 rtf "
              f"{hf['p50_rtf']:.4f}, e2e mean {hf['mean_e2el_ms']:.1f} ms")


def main(args: argparse.Namespace) -> int:
    from omnistage.families.registry import resolve_model

    prompts = clips(args.num_prompts, args.audio_seconds, args.seed)
    driver = TranscribeHttp(args.url, args.served_model or args.model) if args.url else TranscribeInProcess(args)
    levels = asyncio.run(drive_levels(args, prompts, driver))
    hf = None
    if args.baseline == "hf":
        hf = run_hf(resolve_model(args.model), prompts[:args.hf_num_prompts or min(args.num_prompts, 4)],
                    args.output_tokens)
        for figures in levels.values():
            figures["audio_s_per_wall_s_ratio_vs_hf"] = figures["audio_s_per_wall_s"] / hf["audio_s_per_wall_s"]
    print("backend: openai-audio-transcriptions")
    print_levels(levels, hf)
    if args.json_out:
        Path(args.json_out).write_text(json.dumps({
            "model": str(args.model), "backend": "openai-audio-transcriptions",
            "driver": "http" if args.url else "in-process", "num_prompts": args.num_prompts,
            "audio_seconds": args.audio_seconds, "output_tokens": args.output_tokens, "ignore_eos": args.ignore_eos,
            "dtype": args.dtype, "quantization": dict(args.quantization),
            "concurrency": {str(c): f for c, f in levels.items()}, "hf_baseline": hf}, indent=2))
    return 0
