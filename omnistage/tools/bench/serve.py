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
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING

import msgspec

from omnistage.tools.bench.levels import BenchPrompt, drive, progress_bar, sse_record
from omnistage.tools.bench.metrics import StreamRecord
from omnistage.tools.bench.report import add_ratios, compare_policies, plot, print_table

if TYPE_CHECKING:
    from omnistage.config.pipeline import StageOverrides


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
                 scheduling: str | None = None, code2wav_max_batch: int | None = None,
                 overrides: StageOverrides | None = None) -> None:
        from omnistage.config.pipeline import load_pipeline, load_preset
        from omnistage.families.registry import resolve_model
        from omnistage.pipeline.async_omni import AsyncOmni
        from omnistage.pipeline.engine import OmniPipeline, preset_for
        from omnistage.pipeline.runtime import PipelineOptions

        base = load_pipeline(stage_config) if stage_config else load_preset(preset_for(resolve_model(model)))
        spec = pinned_spec(base, audio_frames, scheduling, code2wav_max_batch)
        self.omni = AsyncOmni(pipeline=OmniPipeline(model, spec, PipelineOptions(talker_min_new_tokens=audio_frames),
                                                    overrides=overrides))
        self.processor = self.omni.front_end.processor
        self.rate = self.omni.front_end.audio.sample_rate if self.omni.front_end.audio else 0
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
        record = StreamRecord(time.perf_counter(), self.rate)
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

def run_hf(folder: Path, prompts: list[BenchPrompt], output_tokens: int, audio_frames: int, seed: int,
           num: int, progress: bool = True) -> dict[str, float]:
    from omnistage.tools.bench.hf_baseline import HFBaseline, summarize_hf

    hf = HFBaseline(folder)
    hf.run(prompts[0].token_ids, 2, 2, seed)  # warm-up
    bar = progress_bar(num, "hf baseline") if progress else None
    results = []
    for i, prompt in enumerate(prompts[:num]):
        results.append(hf.run(prompt.token_ids, output_tokens, audio_frames, seed + i))
        if bar is not None:
            bar.update(1)
    if bar is not None:
        bar.close()
    return summarize_hf(results)


def main(args: argparse.Namespace) -> int:
    from omnistage.families.registry import DEFAULT_REGISTRY, resolve_model
    from omnistage.pipeline.serve_flags import model_overrides

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
                                     args.initial_chunk_frames, policy, args.code2wav_max_batch,
                                     model_overrides(args))
        name = policy or "default"
        name = name if name not in runs else f"{name}#{sum(k.split('#')[0] == name for k in runs) + 1}"
        runs[name] = asyncio.run(drive(args, prompts, driver))
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
