"""``omnistage bench serve``: stream metrics, the JSON it writes, and the ratios against transformers."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
import json
from pathlib import Path

import pytest

from omnistage.config.pipeline import ConfigError, load_preset, parse_pipeline
from omnistage.families.qwen3_omni.family import PRESET as OMNI_PRESET
from omnistage.tools.bench.levels import BenchPrompt, bench_levels
from omnistage.tools.bench.metrics import StreamRecord, summarize
from omnistage.tools.bench.process_cpu import cpu_seconds, stage_cpu_seconds
from omnistage.tools.bench.report import add_ratios, plot
from omnistage.tools.bench.serve import pinned_spec

SAMPLE_RATE = 24000  # the API's PCM


def _record(start: float, packets: list[tuple[float, float]], tokens: list[float]) -> StreamRecord:
    r = StreamRecord(start)
    for t in tokens:
        r.add_tokens(t, 1)
    for t, seconds in packets:
        r.add_audio(t, int(seconds * SAMPLE_RATE))
    r.end = max([t for t, _ in packets] + tokens)
    return r


def test_underrun_is_audio_received_falling_behind_wall_time() -> None:
    smooth = _record(0.0, [(1.0, 1.0), (1.9, 1.0), (2.8, 1.0)], [0.1])
    assert smooth.underrun_s() == 0.0
    late = _record(0.0, [(1.0, 0.5), (2.0, 1.0)], [0.1])  # 0.5 s played, second packet 1 s after the first
    assert late.underrun_s() == pytest.approx(0.5)
    assert late.audio_ttfp == 1.0 and late.audio_seconds == pytest.approx(1.5)
    assert late.audio_rtf == pytest.approx(2.0 / 1.5)


def test_summary_uses_vllm_metric_names() -> None:
    records = [_record(0.0, [(0.5, 2.0)], [0.1, 0.2, 0.4]), _record(0.0, [(0.4, 1.0), (2.0, 1.0)], [0.2, 0.3])]
    failed = StreamRecord(0.0)
    failed.error = "boom"
    out = summarize(records + [failed], wall_s=2.0)
    for key in ("mean_ttft_ms", "median_ttft_ms", "p99_ttft_ms", "mean_tpot_ms", "mean_itl_ms", "p90_e2el_ms",
                "mean_audio_ttfp_ms", "p99_audio_rtf", "output_throughput", "audio_throughput"):
        assert key in out, key
    assert out["completed"] == 2 and out["failed"] == 1
    assert out["median_ttft_ms"] == pytest.approx(150.0)
    assert out["total_output_tokens"] == 5 and out["audio_throughput"] == pytest.approx(2.0)
    assert out["underrun_streams"] == 1 and out["max_underrun_ms"] == pytest.approx(600.0)


def test_ratios_against_hf() -> None:
    levels = {1: {"audio_throughput": 4.0, "mean_audio_ttfp_ms": 50.0}}
    add_ratios(levels, {"audio_throughput": 2.0, "mean_e2el_ms": 1000.0})
    assert levels[1]["audio_throughput_ratio_vs_hf"] == 2.0 and levels[1]["ttfp_ratio_vs_hf_e2e"] == 0.05


class _FakeDriver:
    """Streams a canned answer after a short sleep; records the most requests it saw in flight."""

    def __init__(self) -> None:
        self.in_flight = self.peak = 0

    async def stream(self, prompt: BenchPrompt, seed: int) -> StreamRecord:
        import time

        self.in_flight += 1
        self.peak = max(self.peak, self.in_flight)
        record = StreamRecord(time.perf_counter())
        await asyncio.sleep(0.01)
        now = time.perf_counter()
        record.add_tokens(now, 3)
        record.add_audio(now, SAMPLE_RATE // 10)
        record.end = now
        self.in_flight -= 1
        return record


def test_bench_levels_bounds_concurrency() -> None:
    driver = _FakeDriver()
    prompts = [BenchPrompt([1, 2], "x")] * 6
    levels = asyncio.run(bench_levels(driver, prompts, [2], seed=0, warmup=0, progress=False))
    assert driver.peak == 2
    assert levels[2]["completed"] == 6 and levels[2]["total_output_tokens"] == 18


def test_a_level_reports_the_server_processes_cpu_per_audio_second() -> None:
    spent = iter([10.0, 10.3])  # CPU seconds before and after the level
    levels = asyncio.run(bench_levels(_FakeDriver(), [BenchPrompt([1], "x")] * 3, [1], seed=0, warmup=0,
                                      progress=False, server_cpu=lambda: next(spent)))
    assert levels[1]["server_cpu_s"] == pytest.approx(0.3)
    assert levels[1]["server_cpu_s_per_audio_s"] == pytest.approx(0.3 / 0.3)  # three packets of 0.1 s


def test_a_level_charges_each_stage_and_counts_the_cores_kept_busy() -> None:
    spent = iter([{"talker": 1.0}, {"talker": 1.2, "code2wav": 0.3}])  # code2wav's replica started mid-level
    server = iter([5.0, 5.1])
    levels = asyncio.run(bench_levels(_FakeDriver(), [BenchPrompt([1], "x")] * 3, [1], seed=0, warmup=0,
                                      progress=False, server_cpu=lambda: next(server),
                                      stage_cpu=lambda: next(spent)))
    figures = levels[1]
    assert figures["stage_cpu_s_per_audio_s"] == pytest.approx({"code2wav": 0.3 / 0.3, "talker": 0.2 / 0.3})
    assert figures["cpu_s_per_audio_s"] == pytest.approx(0.6 / 0.3)
    assert figures["cores_busy"] == pytest.approx(0.6 / figures["duration_s"], rel=0.05)


def test_stage_replicas_below_a_process_are_charged_by_the_stage_they_name() -> None:
    busy = "import time\nend = time.process_time() + 0.2\nwhile time.process_time() < end: pass\ntime.sleep(30)"
    idle = "import time; time.sleep(30)"
    procs = [subprocess.Popen([sys.executable, "-c", busy, "--stage", "talker"]),
             subprocess.Popen([sys.executable, "-c", idle, "--stage", "code2wav"]),
             subprocess.Popen([sys.executable, "-c", idle])]  # names no stage: not charged
    try:
        deadline = time.monotonic() + 20
        while (spent := stage_cpu_seconds(os.getpid())).get("talker", 0.0) < 0.2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert set(spent) == {"talker", "code2wav"}
        assert spent["talker"] >= 0.2 > spent["code2wav"]
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


def test_a_process_cpu_time_grows_as_it_works() -> None:
    before = cpu_seconds(os.getpid())
    deadline = time.process_time() + 0.05
    while time.process_time() < deadline:
        pass
    assert cpu_seconds(os.getpid()) - before >= 0.03


def test_a_record_counts_seconds_at_its_own_rate() -> None:
    record = StreamRecord(0.0, rate=44100)
    record.add_audio(0.5, 44100)
    assert record.audio_seconds == 1.0


def test_pinned_spec_holds_talker_length_and_sets_policy() -> None:
    spec = pinned_spec(load_preset(OMNI_PRESET), audio_frames=40, scheduling="deadline", code2wav_max_batch=2)
    assert spec.stage("talker").sampling.max_tokens == 40
    assert {s.engine.scheduling for s in spec.stages} == {"deadline"}
    assert spec.stage("code2wav").engine.max_num_seqs == 2 and spec.stage("thinker").engine.max_num_seqs == 32


def test_stage_config_rejects_unknown_policy() -> None:
    data = {"name": "x", "stages": [{"name": "t", "kind": "ar", "model": "thinker",
                                     "engine": {"scheduling": "lifo"}}], "edges": []}
    with pytest.raises(ConfigError, match="scheduling"):
        parse_pipeline(data)


def test_plot_writes_latency_vs_concurrency_png(tmp_path: Path) -> None:
    from PIL import Image

    levels = {c: {"p50_e2el_ms": 100.0 * c, "p99_e2el_ms": 150.0 * c, "median_audio_ttfp_ms": 50.0 * c,
                  "median_ttft_ms": 5.0} for c in (1, 4, 16)}
    out = tmp_path / "latency.png"
    assert plot(levels, str(out))
    with Image.open(out) as image:
        assert image.format == "PNG" and image.size == (600, 400)  # figsize 6x4 at 100 dpi


def test_plot_without_matplotlib_says_so(tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "matplotlib", None)
    assert not plot({1: {"p50_e2el_ms": 1.0}}, str(tmp_path / "x.png"))
    assert "matplotlib is not installed" in capsys.readouterr().err


@pytest.mark.timeout(120)
def test_cli_end_to_end_with_hf_baseline(tiny_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from omnistage.entrypoints.cli import main

    out = tmp_path / "serve.json"
    code = main(["bench", "serve", "--model", str(tiny_dir), "--concurrency", "1,2", "--num-prompts", "2",
                 "--random-input-len", "8", "--output-tokens", "6", "--audio-frames", "12", "--baseline", "hf",
                 "--hf-num-prompts", "1", "--no-progress", "--json", str(out)])
    assert code == 0
    data = json.loads(out.read_text())
    for c in ("1", "2"):
        fig = data["concurrency"][c]
        assert fig["completed"] == 2 and fig["failed"] == 0
        assert fig["total_output_tokens"] == 12  # ignore_eos: exactly 6 tokens each
        assert fig["total_audio_s"] > 0 and fig["audio_throughput_ratio_vs_hf"] > 0
        assert fig["ttfp_ratio_vs_hf_e2e"] > 0
    assert data["hf_baseline"]["total_audio_s"] > 0
    assert "audio x hf" in capsys.readouterr().out


def test_http_driver_reads_sse_text_and_pcm16_audio() -> None:
    import base64

    import httpx

    from omnistage.tools.bench.serve import HttpDriver

    pcm = base64.b64encode(b"\x00\x00" * 2400).decode()
    events = [{"choices": [{"delta": {"content": "hi"}}]},
              {"choices": [{"delta": {"audio": {"data": pcm}}}]},
              {"choices": [{"delta": {"content": " there", "audio": {"data": pcm}}}]}]
    body = "".join(f"data: {json.dumps(e)}\n\n" for e in events) + "data: [DONE]\n\n"
    seen = {}

    def handler(request: httpx.Request) -> httpx.Response:
        seen.update(json.loads(request.content))
        return httpx.Response(200, text=body, headers={"content-type": "text/event-stream"})

    async def go() -> StreamRecord:
        driver = HttpDriver("http://x", "tiny", 8, transport=httpx.MockTransport(handler))
        try:
            return await driver.stream(BenchPrompt([1], "hello"), seed=3)
        finally:
            await driver.close()

    record = asyncio.run(go())
    assert record.ok and record.num_tokens == 2 and record.audio_seconds == pytest.approx(0.2)
    assert seen["stream"] and seen["max_tokens"] == 8 and seen["modalities"] == ["text", "audio"]


def test_hotpath_splits_a_step_into_model_and_engine_time(tiny_dir: Path) -> None:
    import torch

    from omnistage.tools.bench.engine import load_stage
    from omnistage.tools.bench.hotpath import measure

    row = measure(load_stage(str(tiny_dir), "talker", "cpu", torch.float32), batch=2, steps=3)
    assert row["model_ms"] > 0 and row["non_model_ms"] >= 0
    assert row["step_ms"] >= row["model_ms"]


def test_speech_http_driver_reads_sse_audio_events() -> None:
    import base64

    import httpx

    from omnistage.tools.bench.speech import SpeechHttpDriver

    pcm = base64.b64encode(b"\x00\x00" * 2400).decode()
    events = [{"type": "speech.audio.delta", "audio": pcm}, {"type": "speech.audio.delta", "audio": pcm},
              {"type": "speech.audio.done", "usage": {"input_tokens": 3, "output_tokens": 2, "total_tokens": 5}}]
    body = "".join(f"data: {json.dumps(e)}\n\n" for e in events)
    seen = {}

    def handler(request: httpx.Request) -> httpx.Response:
        seen.update(json.loads(request.content))
        return httpx.Response(200, text=body, headers={"content-type": "text/event-stream"})

    async def go() -> StreamRecord:
        driver = SpeechHttpDriver("http://x", "tts", transport=httpx.MockTransport(handler))
        try:
            return await driver.stream(BenchPrompt([], "Hello there."), seed=0)
        finally:
            await driver.close()

    record = asyncio.run(go())
    assert record.ok and record.audio_seconds == pytest.approx(0.2) and record.end is not None
    assert seen == {"model": "tts", "input": "Hello there.", "voice": "alloy", "response_format": "pcm",
                    "stream_format": "sse"}


def test_bench_serve_speech_backend_on_a_tiny_tts_checkpoint(tmp_path: Path) -> None:
    """In-process pipeline vs the sequential reference way, fixed lengths: every stream makes its frames."""
    import argparse

    from omnistage.tools.bench.cli import add_serve_parser
    from omnistage.families.qwen3_tts.make_tiny import make_tiny_tts

    folder = make_tiny_tts(tmp_path / "tts", seed=0)
    parser = argparse.ArgumentParser()
    add_serve_parser(parser.add_subparsers())
    out = tmp_path / "bench.json"
    args = parser.parse_args(["serve", "--backend", "openai-audio-speech", "--model", str(folder), "--concurrency",
                              "2", "--num-prompts", "2", "--random-input-len", "4", "--audio-frames", "6",
                              "--warmup", "0", "--baseline", "sequential", "--hf-num-prompts", "1",
                              "--no-progress", "--json", str(out)])
    assert args.func(args) == 0
    report = json.loads(out.read_text())
    level = report["concurrency"]["2"]
    assert report["backend"] == "openai-audio-speech" and level["completed"] == 2 and level["failed"] == 0
    assert level["audio_throughput"] > 0 and level["audio_streams"] == 2
    assert report["sequential_baseline"]["mean_audio_s"] == pytest.approx(6 * 1920 / 24000)
    assert "audio_throughput_ratio_vs_hf" in level


def test_reference_baseline_times_the_qwen_tts_package(tmp_path: Path) -> None:
    """``--baseline reference``: qwen-tts's own generate on the same utterances, its audio counted from its wav."""
    from omnistage.tools.bench.speech import run_reference, speech_prompts
    from omnistage.families.qwen3_tts.make_tiny import make_tiny_tts
    from omnistage.tools.verify.tts_reference_env import ReferenceUnavailable, reference_python

    try:
        reference_python()
    except ReferenceUnavailable as exc:
        pytest.skip(f"the qwen-tts reference environment cannot be made here: {exc}")
    folder = make_tiny_tts(tmp_path / "tts", seed=0)
    figures = run_reference(folder, speech_prompts(2, 4, seed=0), audio_frames=6, threads=1)
    assert figures["completed"] == 2
    assert figures["mean_audio_s"] == pytest.approx(6 * 1920 / 24000)  # held to the frames asked, as ours are
    assert figures["audio_throughput"] > 0 and figures["min_e2el_ms"] <= figures["mean_e2el_ms"]


def test_speech_driver_passes_the_first_chunk_size(tmp_path: Path) -> None:
    """``--initial-chunk-frames`` reaches a TTS request: its first audio packet is that many frames (it was dropped,
    so every speech bench ran the stage config's first chunk whatever was asked)."""
    import asyncio

    from omnistage.tools.bench.speech import SpeechInProcessDriver, speech_prompts
    from omnistage.families.qwen3_tts.make_tiny import make_tiny_tts

    folder = make_tiny_tts(tmp_path / "tts", seed=0)
    prompt = speech_prompts(1, 4, seed=0)[0]

    async def first_packet(initial: int | None) -> int:
        driver = SpeechInProcessDriver(str(folder), 12, in_process=True, initial_chunk_frames=initial)
        try:
            record = await driver.stream(prompt, seed=0)
        finally:
            await driver.close()
        assert record.ok and record.audio, record.error
        return record.audio[0][1]

    # Outputs that queue while the caller is busy reach it merged (AsyncOmni.generate), so on a loaded machine the
    # first packet may hold the second chunk too; merging only ever makes it larger, so one packet of exactly two
    # frames shows the first chunk was two frames (the preset's first chunk never is).
    firsts = []
    while len(firsts) < 3 and 2 * 1920 not in firsts:
        firsts.append(asyncio.run(first_packet(2)))
    assert 2 * 1920 in firsts, firsts
    assert asyncio.run(first_packet(None)) > 2 * 1920  # the preset's first chunk is larger
