"""``/v1/audio/transcriptions`` and ``/v1/audio/translations`` through real clients (the openai SDK in every
response format and streamed, LiteLLM, openai-agents' VoicePipeline) against a live server whose fake thinker
answers "Hello from the fake engine." per segment; the limits, auth and refusals; the segmenter; and one request
on the real tiny pipeline, where the thinker runs text-only and the talker never does."""

from __future__ import annotations

import asyncio
import io
import os
import shutil
import subprocess
import threading
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np
import openai
import pytest
import soundfile as sf

from omnistage.core import Modality
from omnistage.entrypoints.openai.api_server import build_app
from omnistage.entrypoints.openai.server_config import AccessPolicy, ServerLimits
from omnistage.entrypoints.openai.transcription import service as transcription_service
from omnistage.entrypoints.openai.transcription.formats import DeltaJoiner
from omnistage.entrypoints.openai.transcription.segments import split
from tests.entrypoints.fake_engine import FakeEngine, RecordingProcessor, fake_front_end
from tests.entrypoints.server_thread import ServerThread

KEY = "sk-stt-test"
TEXT = "Hello from the fake engine."
RATE = 16000
LIMITS = ServerLimits(max_audio_seconds=70.0, max_media_bytes=3_000_000, max_request_bytes=4_000_000,
                      max_text_chars=2000)
GAPS = ((26.0, 26.6), (53.0, 53.6))  # silences in the long recording, where its cuts should land
LONG_SECONDS = 65.0


def wav_bytes(samples: np.ndarray, rate: int = RATE) -> bytes:
    out = io.BytesIO()
    sf.write(out, samples, rate, format="WAV", subtype="PCM_16")
    return out.getvalue()


def babble(seconds: float, rate: int = RATE, gaps: tuple[tuple[float, float], ...] = ()) -> np.ndarray:
    """Speech-like noise (syllable-rate bursts) with silent ``gaps``."""
    rng = np.random.default_rng(0)
    t = np.arange(int(seconds * rate)) / rate
    audio = (0.2 * rng.standard_normal(t.size) * (0.6 + 0.4 * np.sin(2 * np.pi * 4 * t))).astype(np.float32)
    for lo, hi in gaps:
        audio[int(lo * rate):int(hi * rate)] = 0.0
    return audio


@pytest.fixture(scope="module")
def speech_wav(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    """Real speech from espeak-ng when it is installed, else two seconds of babble."""
    espeak = shutil.which("espeak-ng")
    if espeak is None:
        return wav_bytes(babble(2.0))
    out = tmp_path_factory.mktemp("speech") / "hello.wav"
    subprocess.run([espeak, "-w", str(out), "Hello world, this is a test."], check=True, timeout=30)
    return out.read_bytes()


@pytest.fixture(scope="module")
def long_wav() -> bytes:
    return wav_bytes(babble(LONG_SECONDS, gaps=GAPS))


@dataclass
class Served:
    url: str
    engine: FakeEngine

    def client(self, **kw: object) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.url}/v1", api_key=KEY, max_retries=0, timeout=30, **kw)

    def post(self, path: str, data: dict[str, object], file: bytes, key: str | None = KEY) -> httpx.Response:
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        return httpx.post(f"{self.url}{path}", data=data, files={"file": ("a.wav", file, "audio/wav")},
                          headers=headers, timeout=30)


def _serve(engine: FakeEngine, limits: ServerLimits = LIMITS) -> Iterator[Served]:
    thread = ServerThread(build_app(engine, limits, access=AccessPolicy(api_keys=(KEY,))))
    try:
        yield Served(thread.start(), engine)
    finally:
        thread.stop()


@pytest.fixture(scope="module")
def live(processor: RecordingProcessor) -> Iterator[Served]:
    yield from _serve(FakeEngine(fake_front_end(processor)))


@pytest.fixture()
def stt(live: Served, processor: RecordingProcessor) -> Served:
    live.engine.reset()
    processor.seen_audios.clear()
    return live


def _prompt_text(engine: FakeEngine, processor: RecordingProcessor, index: int = 0) -> str:
    return processor.tokenizer.decode(list(engine.requests[index].prompt.token_ids))


# ---- the openai SDK, every format -------------------------------------------------------------------------------


def test_json_is_the_thinkers_text_with_token_usage(stt: Served, speech_wav: bytes,
                                                    processor: RecordingProcessor) -> None:
    result = stt.client().audio.transcriptions.create(model="fake-omni", file=("hello.wav", speech_wav),
                                                      language="en", prompt="Omnistage")
    assert result.text == TEXT
    assert result.usage.type == "tokens" and result.usage.output_tokens == 6
    assert result.usage.input_tokens == len(stt.engine.requests[0].prompt.token_ids) > 6
    (request,) = stt.engine.requests
    assert request.modalities == frozenset({Modality.TEXT}) and request.sampling.temperature == 0.0
    prompt = _prompt_text(stt.engine, processor)
    assert "Transcribe" in prompt and "'en'" in prompt and "Omnistage" in prompt
    seconds = sf.info(io.BytesIO(speech_wav)).duration
    (heard,) = processor.seen_audios  # the whole file, at 16 kHz
    assert abs(len(heard) / RATE - seconds) < 0.01


@pytest.mark.parametrize("fmt", ["text", "srt", "vtt"])
def test_text_srt_and_vtt(stt: Served, speech_wav: bytes, fmt: str) -> None:
    out = stt.client().audio.transcriptions.create(model="fake-omni", file=("hello.wav", speech_wav),
                                                   response_format=fmt)
    seconds = sf.info(io.BytesIO(speech_wav)).duration
    end = f"00:00:{int(seconds):02d}{',' if fmt == 'srt' else '.'}{round(seconds % 1 * 1000):03d}"
    expected = {"text": TEXT, "srt": f"1\n00:00:00,000 --> {end}\n{TEXT}\n\n",
                "vtt": f"WEBVTT\n\n00:00:00.000 --> {end}\n{TEXT}\n\n"}[fmt]
    assert out == expected


def test_verbose_json_segments_are_audio_boundaries(stt: Served, long_wav: bytes) -> None:
    out = stt.client().audio.transcriptions.create(model="fake-omni", file=("long.wav", long_wav),
                                                   response_format="verbose_json",
                                                   timestamp_granularities=["segment"])
    assert out.duration == LONG_SECONDS and out.language == "unknown" and out.usage.seconds == LONG_SECONDS
    assert out.text == " ".join([TEXT] * 3) and out.words is None
    starts, ends = [s.start for s in out.segments], [s.end for s in out.segments]
    assert starts[0] == 0.0 and ends[-1] == LONG_SECONDS and starts[1:] == ends[:-1]  # contiguous, end to end
    for end, (lo, hi) in zip(ends, GAPS):
        assert lo < end < hi  # each cut fell in the silence before the 30 s mark
    for i, segment in enumerate(out.segments):
        assert segment.id == i and segment.text == TEXT and segment.seek == round(segment.start * 100)
        assert segment.tokens == [1, 2, 3, 4, 5, 6]
        assert segment.avg_logprob == pytest.approx(-0.35)  # the fake's token logprobs: -0.1 .. -0.6
        assert segment.compression_ratio > 0 and segment.temperature == 0.0
    assert len(stt.engine.requests) == 3 and all(r.sampling.logprobs == 0 for r in stt.engine.requests)


def test_word_timestamps_are_refused_clearly(stt: Served, speech_wav: bytes) -> None:
    with pytest.raises(openai.BadRequestError) as err:
        stt.client().audio.transcriptions.create(model="fake-omni", file=("a.wav", speech_wav),
                                                 response_format="verbose_json", timestamp_granularities=["word"])
    assert "word" in err.value.message and "timings" in err.value.message
    assert err.value.body["param"] == "timestamp_granularities" and not stt.engine.requests


def test_stream_sends_delta_and_done_events(stt: Served, long_wav: bytes) -> None:
    events = list(stt.client().audio.transcriptions.create(model="fake-omni", file=("long.wav", long_wav),
                                                           stream=True))
    *deltas, done = events
    assert {e.type for e in deltas} == {"transcript.text.delta"} and done.type == "transcript.text.done"
    assert "".join(e.delta for e in deltas) == done.text == " ".join([TEXT] * 3)
    assert done.usage.output_tokens == 18 and done.usage.total_tokens == done.usage.input_tokens + 18


def test_translations(stt: Served, speech_wav: bytes, processor: RecordingProcessor) -> None:
    client = stt.client()
    assert client.audio.translations.create(model="fake-omni", file=("a.wav", speech_wav)).text == TEXT
    assert "into English" in _prompt_text(stt.engine, processor)
    verbose = client.audio.translations.create(model="fake-omni", file=("a.wav", speech_wav),
                                               response_format="verbose_json")
    assert verbose.language == "english" and verbose.segments[0].text == TEXT and verbose.segments[0].start == 0
    srt = client.audio.translations.create(model="fake-omni", file=("a.wav", speech_wav), response_format="srt")
    assert srt.startswith("1\n00:00:00,000 --> ") and srt.endswith(f"{TEXT}\n\n")


# ---- other clients ----------------------------------------------------------------------------------------------


def test_litellm_transcription(stt: Served, speech_wav: bytes, tmp_path: Path) -> None:
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no fetch of the price list
    import litellm

    path = tmp_path / "hello.wav"
    path.write_bytes(speech_wav)
    with path.open("rb") as f:
        result = litellm.transcription(model="openai/fake-omni", file=f, api_base=f"{stt.url}/v1", api_key=KEY)
    assert result.text == TEXT and stt.engine.requests[0].modalities == frozenset({Modality.TEXT})


def test_openai_agents_voice_pipeline_hears_through_the_endpoint(stt: Served, speech_wav: bytes) -> None:
    """openai-agents 0.24's ``OpenAISTTModel.transcribe`` (a whole ``AudioInput``) posts to
    /v1/audio/transcriptions; its streamed sessions use the realtime WebSocket instead."""
    from agents.voice import AudioInput, OpenAIVoiceModelProvider, VoicePipeline, VoicePipelineConfig
    from agents.voice import VoiceWorkflowBase

    heard: list[str] = []

    class Echo(VoiceWorkflowBase):
        async def run(self, transcription: str) -> AsyncIterator[str]:
            heard.append(transcription)
            yield "Got it."

    samples, rate = sf.read(io.BytesIO(speech_wav), dtype="int16")

    async def run() -> int:
        client = openai.AsyncOpenAI(base_url=f"{stt.url}/v1", api_key=KEY, max_retries=0)
        config = VoicePipelineConfig(model_provider=OpenAIVoiceModelProvider(openai_client=client),
                                     tracing_disabled=True)
        pipeline = VoicePipeline(workflow=Echo(), stt_model="fake-omni", tts_model="fake-omni", config=config)
        result = await pipeline.run(AudioInput(buffer=samples, frame_rate=rate))
        return sum(len(e.data) for e in [e async for e in result.stream()] if e.type == "voice_stream_event_audio")

    audio_samples = asyncio.run(run())
    assert heard == [TEXT] and audio_samples > 0
    stt_request, tts_request = stt.engine.requests
    assert not stt_request.wants_audio and tts_request.wants_audio


# ---- refusals, limits, auth -------------------------------------------------------------------------------------


def test_no_key_is_401(stt: Served, speech_wav: bytes) -> None:
    r = stt.post("/v1/audio/transcriptions", {"model": "fake-omni"}, speech_wav, key=None)
    assert r.status_code == 401 and not stt.engine.requests


def test_too_long_audio_is_refused_from_its_header(stt: Served, monkeypatch: pytest.MonkeyPatch) -> None:
    def never(*_: object, **__: object) -> None:
        raise AssertionError("decoded")

    monkeypatch.setattr(transcription_service, "decode_audio_item", never)
    r = stt.post("/v1/audio/transcriptions", {"model": "fake-omni"}, wav_bytes(np.zeros(8000 * 75), 8000))
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert "--max-audio-seconds" in error["message"] and error["param"] == "file"
    assert error["code"] == "audio_too_long" and not stt.engine.requests


@pytest.mark.parametrize(("data", "file", "status", "needle"), [
    ({"model": "fake-omni"}, b"this is not audio" * 100, 400, "not audio"),
    ({"model": "fake-omni"}, b"\0" * 3_100_000, 400, "--max-media-bytes"),
    ({"model": "fake-omni"}, b"\0" * 4_100_000, 413, "larger than 4000000 bytes"),
    ({"model": "fake-omni", "prompt": "x" * 2001}, b"", 400, "--max-text-chars"),
    ({"model": "fake-omni", "stream": "true", "response_format": "srt"}, b"", 400, "json or text"),
    ({"model": "fake-omni", "language": "English please"}, b"", 400, "ISO-639-1"),
    ({"model": "fake-omni", "temperature": "1.5"}, b"", 400, "temperature"),
    ({"model": "nope"}, b"", 404, "nope"),
], ids=["not-audio", "file-size", "body-size", "prompt", "stream-srt", "language", "temperature", "model"])
def test_refusals(stt: Served, data: dict[str, object], file: bytes, status: int, needle: str) -> None:
    r = stt.post("/v1/audio/transcriptions", data, file)
    assert r.status_code == status, r.text
    assert needle in r.json()["error"]["message"] and not stt.engine.requests


def test_a_tts_checkpoint_cannot_transcribe(speech_wav: bytes) -> None:
    for served in _serve(FakeEngine(fake_front_end(None), model_name="tts")):
        for path in ("/v1/audio/transcriptions", "/v1/audio/translations"):
            r = served.post(path, {"model": "tts"}, speech_wav)
            assert r.status_code == 400 and r.json()["error"]["code"] == "transcription_not_supported", r.text
            assert "text-to-speech" in r.json()["error"]["message"]


def test_admission_bounds_transcriptions(processor: RecordingProcessor, speech_wav: bytes) -> None:
    engine = FakeEngine(fake_front_end(processor), delay_s=0.2)
    for served in _serve(engine, ServerLimits(max_queued_requests=1)):
        first = threading.Thread(target=served.post, args=("/v1/audio/transcriptions", {"model": "fake-omni"},
                                                           speech_wav))
        first.start()
        while not engine.requests:  # the first holds the only place
            threading.Event().wait(0.01)
        r = served.post("/v1/audio/transcriptions", {"model": "fake-omni"}, speech_wav)
        first.join()
        assert r.status_code == 429 and "Retry-After" in r.headers, r.text
        assert len(engine.requests) == 1


def test_openapi_documents_both_routes(stt: Served) -> None:
    schema = httpx.get(f"{stt.url}/openapi.json", headers={"Authorization": f"Bearer {KEY}"}).json()
    components = schema["components"]["schemas"]
    for path, model in (("/v1/audio/transcriptions", "Transcription"), ("/v1/audio/translations", "Translation")):
        post = schema["paths"][path]["post"]
        body = post["requestBody"]["content"]["multipart/form-data"]["schema"]["$ref"].rsplit("/", 1)[1]
        assert {"file", "model"} <= set(components[body]["required"])
        refs = [r["$ref"] for r in post["responses"]["200"]["content"]["application/json"]["schema"]["anyOf"]]
        assert refs == [f"#/components/schemas/{model}", f"#/components/schemas/{model}Verbose"]
        assert "422" not in post["responses"] and "text/plain" in post["responses"]["200"]["content"]
    assert "timestamp_granularities[]" in components["Body_create_transcription_v1_audio_transcriptions_post"][
        "properties"]
    assert {"TranscriptionSegment", "TranscriptionTokenUsage"} <= set(components)


# ---- the pieces -------------------------------------------------------------------------------------------------


def test_split_covers_the_audio_in_windows_cut_at_silence() -> None:
    audio = babble(LONG_SECONDS, gaps=GAPS)
    segments = split(audio, RATE)
    assert segments[0].start == 0 and segments[-1].end == len(audio)
    assert all(a.end == b.start for a, b in zip(segments, segments[1:]))
    assert all(s.end - s.start <= 30 * RATE for s in segments) and len(segments) == 3
    assert all(lo * RATE < s.end < hi * RATE for s, (lo, hi) in zip(segments, GAPS))  # cut in the silences
    assert split(np.zeros(0, np.float32), RATE) == []
    assert [(s.start, s.end) for s in split(babble(10.0), RATE)] == [(0, 10 * RATE)]
    no_silence = split(babble(61.0), RATE)  # no quiet moment: cuts still within each window's last 5 s
    assert all(25 * RATE <= s.end - s.start <= 30 * RATE for s in no_silence[:-1])


def test_delta_joiner_gives_the_joined_stripped_text() -> None:
    joiner = DeltaJoiner()
    pieces = [(0, " Hello"), (0, " there "), (0, " "), (1, "  "), (1, "Next"), (1, " one. "), (2, " "), (3, "End")]
    sent = "".join(joiner.feed(i, t) for i, t in pieces)
    assert sent == joiner.text == "Hello there Next one. End"


@pytest.mark.parametrize(("segments", "joined"), [
    (["你好。", "今天天气很好。"], "你好。今天天气很好。"),  # Chinese: no space between sentences
    (["こんにちは", "元気ですか"], "こんにちは元気ですか"),  # Japanese kana and kanji
    (["รถไฟ", "มาแล้ว"], "รถไฟมาแล้ว"),  # Thai
    (["안녕하세요.", "반갑습니다."], "안녕하세요. 반갑습니다."),  # Korean spaces its words
    (["Hello.", "你好"], "Hello.你好"),
    (["It costs", "5 dollars."], "It costs 5 dollars."),
    (["", "Alone", ""], "Alone"),
])
def test_segments_of_unspaced_scripts_join_without_a_space(segments: list[str], joined: str) -> None:
    """Whole answers (``join_texts``) and streamed deltas (``DeltaJoiner``) put the same separator between
    segments: a space, except where either side is written without spaces (Chinese, Japanese, Thai...)."""
    from omnistage.entrypoints.openai.transcription.formats import join_texts

    assert join_texts(segments) == joined
    joiner = DeltaJoiner()
    sent = "".join(joiner.feed(i, text[:2]) + joiner.feed(i, text[2:]) for i, text in enumerate(segments))
    assert sent == joiner.text == joined


# ---- the real tiny pipeline -------------------------------------------------------------------------------------


@pytest.mark.e2e
def test_the_real_thinker_transcribes_text_only(tiny_dir: Path, speech_wav: bytes,
                                                tmp_path_factory: pytest.TempPathFactory) -> None:
    """On the tiny random checkpoint (its words are noise): the request reaches the thinker as text-only, no
    output carries audio, and the talker replica never holds a request while it runs."""
    from omnistage.pipeline.async_omni import AsyncOmni
    from omnistage.pipeline.runtime import PipelineOptions
    from tests.pipeline.specs import small_dict, write_spec

    engine = AsyncOmni(tiny_dir, write_spec(tmp_path_factory.mktemp("stages"), small_dict()),
                       PipelineOptions(in_process=True), "tiny")
    outputs, talker_load = [], []
    generate = engine.generate

    async def recorded(request):  # noqa: ANN001, ANN202 - the engine's own signature
        async for out in generate(request):
            outputs.append((request, out))
            talker_load.extend(r.running + r.queue_depth for r in engine.stats().replicas if r.stage == "talker")
            yield out

    engine.generate = recorded  # type: ignore[method-assign]
    thread = ServerThread(build_app(engine))
    try:
        client = openai.OpenAI(base_url=f"{thread.start()}/v1", api_key="unused", max_retries=0, timeout=120)
        result = client.audio.transcriptions.create(model="tiny", file=("hello.wav", speech_wav))
    finally:
        thread.stop()
        asyncio.run(engine.shutdown())
    assert isinstance(result.text, str) and result.usage.output_tokens >= 1
    assert outputs and all(r.modalities == frozenset({Modality.TEXT}) for r, _ in outputs)
    assert all(out.audio is None for _, out in outputs) and outputs[-1][1].finished
    assert talker_load and not any(talker_load)
