"""``omnistage bench serve --backend openai-audio-speech``: text-to-speech streams under bounded concurrency.

vLLM-Omni's name for the backend. Each request is one utterance of random words; figures are the audio ones of
``bench serve`` (TTFP, RTF, underruns, audio throughput). Two drivers:

* in-process (default): the TTS checkpoint's pipeline (``AsyncOmni``), each utterance held to exactly
  ``--audio-frames`` frames (greedy; a random checkpoint's talker never stops on its own);
* ``--url``: a running ``omnistage serve`` of a TTS checkpoint, ``POST /v1/audio/speech`` with ``stream_format:
  sse`` and PCM, lengths as the server bounds them.

``--baseline reference`` times the ``qwen-tts`` package itself (``generate_custom_voice`` / ``generate_voice_design``,
greedy, one utterance at a time) on the same checkpoint, in the environment ``omnistage verify`` runs it in.
``--baseline pocket-tts`` times Kyutai's ``pocket-tts`` package (its streaming ``generate_audio_stream``, one
utterance at a time) on the same Pocket TTS checkpoint rewritten in its layout (``pocket_native``, ``pocket_env``).
``--baseline sequential`` also generates the same utterances one at a time the reference's way (all codes, then
one whole decode: ``families/qwen3_tts/offline.py``, which ``omnistage verify`` holds equal to ``qwen-tts``), for
the throughput and first-audio ratios.
"""

from __future__ import annotations

import base64
import json
import random
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING

from omnistage.tools.bench.levels import BenchPrompt, drive, sse_record
from omnistage.tools.bench.metrics import StreamRecord
from omnistage.tools.bench.report import add_ratios, plot, print_table
from omnistage.usage_error import UsageError

if TYPE_CHECKING:
    from omnistage.config.pipeline import StageOverrides

WORDS = ("hello", "there", "how", "are", "you", "today", "the", "weather", "is", "fine", "speech", "stream",
         "audio", "voice", "quick", "brown", "fox", "jumps", "over", "lazy", "dog", "morning", "evening", "music")


def speech_prompts(count: int, words: int, seed: int) -> list[BenchPrompt]:
    rng = random.Random(seed)
    return [BenchPrompt([], " ".join(rng.choice(WORDS) for _ in range(words)).capitalize() + ".")
            for _ in range(count)]


class SpeechInProcessDriver:
    def __init__(self, model: str, audio_frames: int, stage_config: str | None = None,
                 in_process: bool = False, initial_chunk_frames: int | None = None,
                 overrides: StageOverrides | None = None) -> None:
        from omnistage.pipeline.async_omni import AsyncOmni
        from omnistage.pipeline.engine import OmniPipeline
        from omnistage.pipeline.runtime import PipelineOptions

        self.omni = AsyncOmni(pipeline=OmniPipeline(model, stage_config, PipelineOptions(in_process=in_process),
                                                    overrides=overrides))
        if self.omni.front_end.speech is None:
            raise ValueError(f"{model} is not a text-to-speech checkpoint (--backend openai-audio-speech)")
        self.audio_frames = audio_frames
        self.initial_chunk_frames = initial_chunk_frames  # None: the stage config's (load-aware) first chunk
        self.rate = self.omni.front_end.audio.sample_rate

    async def stream(self, prompt: BenchPrompt, seed: int) -> StreamRecord:
        from omnistage.core import Modality, OmniRequest
        from omnistage.families.speech import SpeechAsk
        from omnistage.sampling_params import SamplingParams

        speech = self.omni.front_end.speech
        ask = SpeechAsk(prompt.text, speech.speakers[0] if speech.speakers else None,
                        None if speech.speakers else "A clear, calm voice.")
        request = OmniRequest(f"bench-{uuid.uuid4().hex[:8]}", speech.prompt(ask), frozenset({Modality.AUDIO}),
                              SamplingParams(temperature=0.0, max_tokens=self.audio_frames + 1, seed=seed),
                              initial_codec_chunk_frames=self.initial_chunk_frames)
        record = StreamRecord(time.perf_counter(), self.rate)
        async for out in self.omni.generate(request):
            now = time.perf_counter()
            if out.audio is not None:
                record.add_audio(now, int(out.audio.shape[0]))
            if out.finished:
                record.end = now
                record.error = out.error
        return record

    async def close(self) -> None:
        await self.omni.shutdown()


class SpeechHttpDriver:
    """Streams ``/v1/audio/speech`` of a running server (SSE events carrying PCM16)."""

    def __init__(self, url: str, model_name: str, voice: str = "alloy", transport=None) -> None:  # noqa: ANN001
        import httpx

        self.url = url.rstrip("/") + "/v1/audio/speech"
        self.model_name, self.voice = model_name, voice
        self.client = httpx.AsyncClient(timeout=httpx.Timeout(600.0), transport=transport)

    async def stream(self, prompt: BenchPrompt, seed: int) -> StreamRecord:
        body = {"model": self.model_name, "input": prompt.text, "voice": self.voice, "response_format": "pcm",
                "stream_format": "sse"}
        return await sse_record(self.client, self.url, body, self._consume)

    @staticmethod
    def _consume(record: StreamRecord, event: dict, now: float) -> None:
        if event.get("type") == "speech.audio.delta":
            record.add_audio(now, len(base64.b64decode(event["audio"])) // 2)
        elif event.get("type") == "speech.audio.done":
            record.end = now
        elif "error" in event:
            record.error = str(event["error"].get("message"))

    async def close(self) -> None:
        await self.client.aclose()


def run_sequential(folder: Path, prompts: list[BenchPrompt], audio_frames: int) -> dict[str, float]:
    """The reference's way, one utterance at a time: every code first, then one decode of them all."""
    from omnistage.families.qwen3_tts.offline import TTSSettings, generate_offline
    from omnistage.models.qwen3_tts.checkpoint import Qwen3TTSModels
    from omnistage.models.qwen3_tts.request import SpeechInput, TextTokenizer

    models, tokenizer = Qwen3TTSModels.load(folder), TextTokenizer(folder)
    speakers = sorted(models.config.talker.speakers)
    settings = TTSSettings(max_new_tokens=audio_frames + 1)
    e2e, audio, start = [], [], time.perf_counter()
    for prompt in prompts:
        began = time.perf_counter()
        speech = SpeechInput(prompt.text, speaker=speakers[0] if speakers else None,
                             instructions=None if speakers else "A clear, calm voice.")
        wav = generate_offline(models, tokenizer, speech, settings).wav
        e2e.append(time.perf_counter() - began)  # its first audio is its whole audio
        audio.append(wav.numel() / models.config.speech_tokenizer.output_sample_rate)
    wall = time.perf_counter() - start
    return {"completed": len(prompts), "mean_e2el_ms": 1000 * sum(e2e) / len(e2e), "min_e2el_ms": 1000 * min(e2e),
            "best_audio_throughput": max(a / t for a, t in zip(audio, e2e)), "output_throughput": 0.0,
            "audio_throughput": sum(audio) / wall, "mean_audio_s": sum(audio) / len(audio)}

def run_reference(folder: Path, prompts: list[BenchPrompt], audio_frames: int,
                  threads: int | None = None) -> dict[str, float]:
    """``qwen_tts``'s own generation of the same utterances, one at a time, in its cached environment."""
    import tempfile

    from omnistage.models.qwen3_tts.config import Qwen3TTSConfig
    from omnistage.tools.verify.tts_reference_env import run_reference_script

    speakers = sorted(Qwen3TTSConfig.from_folder(folder).talker.speakers)
    job = {"model": str(Path(folder).resolve()), "texts": [p.text for p in prompts], "threads": threads,
           "max_new_tokens": audio_frames + 1, "speaker": speakers[0] if speakers else None,
           "instruct": "A clear, calm voice."}
    with tempfile.TemporaryDirectory(prefix="omnistage-tts-ref-") as tmp:
        out = Path(tmp) / "runs.json"
        run_reference_script(Path(__file__).with_name("tts_reference_speech.py"), job, out, Path(tmp))
        runs = json.loads(out.read_text())["runs"]
    e2e, audio = [r["e2e_s"] for r in runs], [r["audio_s"] for r in runs]
    return {"completed": len(runs), "mean_e2el_ms": 1000 * sum(e2e) / len(e2e), "min_e2el_ms": 1000 * min(e2e),
            "best_audio_throughput": max(a / t for a, t in zip(audio, e2e)), "output_throughput": 0.0,
            "audio_throughput": sum(audio) / sum(e2e), "mean_audio_s": sum(audio) / len(audio)}


def run_pocket_baseline(folder: Path, prompts: list[BenchPrompt], threads: int | None = None) -> dict[str, float]:
    """Kyutai's ``pocket-tts`` package generating the same utterances, one at a time, on the same random weights
    (rewritten in its layout: ``pocket_native``), cloning a synthetic voice with its own encoder."""
    import tempfile

    import soundfile as sf

    from omnistage.tools.bench.pocket_env import run_pocket_tts
    from omnistage.tools.bench.pocket_native import write_native
    from omnistage.tools.verify.tts_compare import synthetic_voice

    config = write_native(folder)
    with tempfile.TemporaryDirectory(prefix="omnistage-pocket-tts-") as tmp:
        sf.write(f"{tmp}/voice.wav", synthetic_voice(3.0), 24000)
        job = {"config": str(config), "texts": [p.text for p in prompts], "voice_wav": f"{tmp}/voice.wav",
               "threads": threads}
        runs = run_pocket_tts(job, Path(tmp))["runs"]
    e2e, audio, ttfp = [r["e2e_s"] for r in runs], [r["audio_s"] for r in runs], [r["ttfp_s"] for r in runs]
    return {"completed": len(runs), "mean_e2el_ms": 1000 * sum(e2e) / len(e2e), "min_e2el_ms": 1000 * min(e2e),
            "mean_ttfp_ms": 1000 * sum(ttfp) / len(ttfp),
            "cpu_s_per_audio_s": sum(r.get("cpu_s", 0.0) for r in runs) / max(sum(audio), 1e-9),
            "best_audio_throughput": max(a / t for a, t in zip(audio, e2e)), "output_throughput": 0.0,
            "audio_throughput": sum(audio) / sum(e2e), "mean_audio_s": sum(audio) / len(audio)}


def run_family_baseline(folder: Path, prompts: list[BenchPrompt], audio_frames: int) -> dict[str, float] | None:
    """The served family's own ``speech_baseline`` hook (transformers' generate, one utterance at a time), or None
    when it declares none."""
    from omnistage.families.base import call_hook
    from omnistage.families.registry import DEFAULT_REGISTRY

    hook = DEFAULT_REGISTRY.for_folder(folder).hooks.speech_baseline
    if not hook:
        return None
    runs = call_hook(hook, folder, [p.text for p in prompts], audio_frames + 1)
    e2e, audio = [r[0] for r in runs], [r[1] for r in runs]  # type: ignore[union-attr]
    return {"completed": len(runs), "mean_e2el_ms": 1000 * sum(e2e) / len(e2e), "min_e2el_ms": 1000 * min(e2e),
            "best_audio_throughput": max(a / t for a, t in zip(audio, e2e)), "output_throughput": 0.0,
            "audio_throughput": sum(audio) / sum(e2e), "mean_audio_s": sum(audio) / len(audio)}


def _baseline(args, folder: Path, prompts: list[BenchPrompt], frames: int) -> dict[str, float]:  # noqa: ANN001
    subset = prompts[:args.hf_num_prompts or min(args.num_prompts, 4)]
    if args.baseline == "hf" and (family := run_family_baseline(folder, subset, frames)) is not None:
        return family
    if args.baseline == "pocket-tts":
        if not (folder / "config.json").is_file() or '"pocket_tts"' not in (folder / "config.json").read_text():
            raise UsageError("--baseline pocket-tts times Kyutai's pocket-tts package: give a Pocket TTS checkpoint "
                             "(omnistage make-tiny --model-type pocket_tts)")
        return run_pocket_baseline(folder, subset)
    run = run_reference if args.baseline == "reference" else run_sequential
    return run(folder, subset, frames)


_SOURCES = {"reference": "the qwen-tts package's own generate", "hf": "transformers' generate (where the family "
            "declares it; else its sequential generation)", "pocket-tts": "the pocket-tts package's own streaming "
            "generation"}


def main(args) -> int:  # noqa: ANN001 - argparse.Namespace of bench serve
    import asyncio

    from omnistage.families.registry import DEFAULT_REGISTRY

    frames = args.audio_frames or args.output_tokens
    prompts = speech_prompts(args.num_prompts, args.random_input_len, args.seed)
    if args.url:
        driver = SpeechHttpDriver(args.url, args.served_model or args.model)
    else:
        from omnistage.pipeline.serve_flags import model_overrides

        driver = SpeechInProcessDriver(args.model, frames, args.stage_config,
                                       initial_chunk_frames=args.initial_chunk_frames,
                                       overrides=model_overrides(args))
    levels = asyncio.run(drive(args, prompts, driver))
    baseline = None
    if args.baseline in ("sequential", "hf", "reference", "pocket-tts"):  # hf: the reference's sequential generation
        baseline = _baseline(args, DEFAULT_REGISTRY.resolve_model(args.model), prompts, frames)
        add_ratios(levels, baseline)
    source = _SOURCES.get(args.baseline, "its sequential generation")
    print("backend: openai-audio-speech" + (f"; the hf columns are {source}, one utterance at a time"
                                            if baseline else ""))
    print_table(levels, baseline)
    if args.plot:
        plot(levels, args.plot)
    if args.json_out:
        Path(args.json_out).write_text(json.dumps({
            "model": str(args.model), "backend": "openai-audio-speech",
            "driver": "http" if args.url else "in-process", "num_prompts": args.num_prompts,
            "words": args.random_input_len, "audio_frames": frames,
            "concurrency": {str(c): f for c, f in levels.items()}, "baseline": args.baseline,
            "sequential_baseline": baseline}, indent=2))
    return 0
