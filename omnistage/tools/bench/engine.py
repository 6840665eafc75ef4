"""``omnistage bench engine``: decode throughput of one stage engine at several batch sizes.

Every request gets a random prompt and generates exactly ``output_len``
tokens (EOS ignored), so batch sizes do the same work per request. All sizes
run in one process on one loaded model, each after a warm-up, best of
``repeats``: the ratios between sizes are what the numbers are for. The
talker makes a whole codec frame per token (code predictor included).
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from omnistage.engine import EngineConfig, EngineCore, Request
from omnistage.runner import ARModel, ARModelRunner, StepHook
from omnistage.sampling_params import SamplingParams


@dataclass
class BenchResult:
    batch: int
    tokens_per_s: float
    num_tokens: int
    seconds: float


@dataclass
class StageUnderTest:
    """A loaded stage: its model, a hook maker, and how to make one benchmark request."""

    model: ARModel
    make_hook: Callable[[], StepHook]
    make_request: Callable[[str, int, SamplingParams, torch.Generator], Request]


def _thinker(folder: Path, device: str, dtype: torch.dtype) -> StageUnderTest:
    from omnistage.models.qwen3_omni.thinker import Thinker

    model = Thinker.from_checkpoint(folder, device, dtype)
    vocab = min(model.config.text_config.vocab_size, 1 << 15)

    def request(rid: str, n: int, params: SamplingParams, gen: torch.Generator) -> Request:
        return Request(rid, torch.randint(0, vocab, (n,), generator=gen).tolist(), params)

    return StageUnderTest(model, StepHook, request)


def _talker(folder: Path, device: str, dtype: torch.dtype) -> StageUnderTest:
    from omnistage.models.qwen3_omni.talker import Talker
    from omnistage.runner.talker_hook import TalkerRequestData, TalkerStepHook, talker_suppress_mask

    model = Talker.from_checkpoint(folder, device, dtype)
    hidden = model.config.text_config.hidden_size
    mask = talker_suppress_mask(model.config.text_config.vocab_size, model.config.codec_eos_token_id, device)

    def request(rid: str, n: int, params: SamplingParams, gen: torch.Generator) -> Request:
        data = TalkerRequestData(tts_pad_embed=torch.zeros(hidden, dtype=dtype, device=device), text_finished=True)
        embeds = (torch.randn(n, hidden, generator=gen) * 0.1).to(device, dtype)
        return Request(rid, None, params, prompt_embeds=embeds, stage_data=data)

    return StageUnderTest(model, lambda: TalkerStepHook(model, mask), request)


def _tts_talker(folder: Path, device: str, dtype: torch.dtype) -> StageUnderTest:
    """Qwen3-TTS's talker (a codec frame per token: the code predictor's 15 passes included); prompts are random
    words made as the serving path makes them, as many as fit in the asked length."""
    from omnistage.families.qwen3_tts.offline import talker_request, talker_step_hook
    from omnistage.models.qwen3_tts.checkpoint import Qwen3TTSModels
    from omnistage.models.qwen3_tts.prompt import build_talker_prompt
    from omnistage.models.qwen3_tts.request import SpeechInput, TextTokenizer, prompt_spec

    models, tokenizer = Qwen3TTSModels.load(folder, device, dtype), TextTokenizer(folder)
    speakers = sorted(models.config.talker.speakers)

    def request(rid: str, n: int, params: SamplingParams, gen: torch.Generator) -> Request:
        words = [f"w{int(i)}" for i in torch.randint(0, 50, (n,), generator=gen)]
        while True:  # the fewest words cut until the prompt (role, codec prefix, text) fits in n tokens
            speech = SpeechInput(" ".join(words), speaker=speakers[0] if speakers else None,
                                 instructions=None if speakers else "A clear, calm voice.")
            prompt = build_talker_prompt(models.talker, models.config, prompt_spec(models.config, tokenizer, speech))
            made = talker_request(models.config, rid, prompt, params)
            if made.num_prompt_tokens <= n or len(words) == 1:
                return made
            words.pop()

    return StageUnderTest(models.talker, lambda: talker_step_hook(models.talker, models.config), request)


def load_stage(model: str, stage: str, device: str, dtype: torch.dtype) -> StageUnderTest:
    from omnistage.families.registry import resolve_model

    loaders = {"thinker": _thinker, "talker": _talker, "tts-talker": _tts_talker}
    if stage not in loaders:
        raise ValueError(f"no engine benchmark for stage {stage!r}")
    return loaders[stage](resolve_model(model), device, dtype)


def run_once(stage: StageUnderTest, config: EngineConfig, batch: int, prompt_len: int, output_len: int,
             seed: int, temperature: float = 0.0, top_k: int = 50) -> float:
    """Seconds to serve ``batch`` requests of ``prompt_len`` + ``output_len`` tokens together (greedy, or sampled
    at ``temperature`` with ``top_k``, seeded: which tokens come out moves a random MoE model's expert choice)."""
    gen = torch.Generator().manual_seed(seed)
    params = (SamplingParams(temperature=temperature, top_k=top_k, max_tokens=output_len, ignore_eos=True, seed=seed)
              if temperature > 0 else SamplingParams(temperature=0.0, max_tokens=output_len, ignore_eos=True))
    core = EngineCore(ARModelRunner(stage.model, config, hook=stage.make_hook()), config)
    for i in range(batch):
        core.add_request(stage.make_request(f"bench-{i}", prompt_len, params, gen))
    start = time.perf_counter()
    core.run_until_done()
    if config.device.startswith("cuda"):
        torch.cuda.synchronize()
    return time.perf_counter() - start


def bench_engine(
    stage: StageUnderTest, batches: list[int], prompt_len: int = 16, output_len: int = 64, repeats: int = 2,
    device: str = "cpu", dtype: torch.dtype = torch.float32, temperature: float = 0.0, top_k: int = 50,
) -> list[BenchResult]:
    max_batch = max(batches)
    blocks_per_req = -(-(prompt_len + output_len) // 16)
    config = EngineConfig(
        block_size=16, num_blocks=max_batch * blocks_per_req + 8, max_num_seqs=max_batch,
        max_num_batched_tokens=max(max_batch * prompt_len, 256), max_model_len=prompt_len + output_len + 16,
        enable_prefix_caching=False, device=device, dtype=dtype,
    )
    run_once(stage, config, 2, prompt_len, 4, seed=0)  # warm-up: first-call allocations, lazy inits
    results = []
    for batch in batches:
        best = min(run_once(stage, config, batch, prompt_len, output_len, r, temperature, top_k)
                   for r in range(repeats))
        tokens = batch * output_len
        results.append(BenchResult(batch, tokens / best, tokens, best))
    return results


def main(args: argparse.Namespace) -> int:
    torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype)
    stage = load_stage(args.model, args.stage, args.device, dtype)
    results = bench_engine(stage, args.batch, args.prompt_len, args.output_len, args.repeats, args.device, dtype,
                           args.temperature, args.top_k)
    base = results[0].tokens_per_s
    for r in results:
        print(f"{args.stage} batch {r.batch:4d}: {r.tokens_per_s:10.1f} tokens/s "
              f"({r.num_tokens} tokens in {r.seconds:.3f} s, x{r.tokens_per_s / base:.2f} vs batch {results[0].batch})")
    if args.json_out:
        payload = {"stage": args.stage, "model": str(args.model), "results": [asdict(r) for r in results]}
        Path(args.json_out).write_text(json.dumps(payload, indent=2))
    return 0
