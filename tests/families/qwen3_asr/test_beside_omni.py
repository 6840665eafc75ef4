"""A speech recogniser served beside an omni model (``serve OMNI --transcription-model ASR_DIR``): two pipelines
in one server, each with its own engine, under one admission bound.

Live (tiny Qwen3-Omni + tiny Qwen3-ASR, espeak-ng speech): ``/v1/models`` lists both; a transcription naming the
recogniser is its greedy reply; a speech-to-speech realtime session whose ``transcription.model`` names it has its
turn written down by the recogniser (deltas while the user speaks, through the OpenAI SDK's realtime client) and
answered by the omni model. Alone: the flags, and the shared bound."""

from __future__ import annotations

import asyncio
import io
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import numpy as np
import openai
import pytest
import soundfile as sf

from omnistage.core import Modality
from omnistage.entrypoints.cli import build_parser
from omnistage.entrypoints.openai.common.admission import Admission, Overloaded
from omnistage.entrypoints.serve_config import ServeConfig
from omnistage.pipeline.reports import HealthReport, ReplicaHealth, StageHealth
from tests.entrypoints.conftest import processor, processor_dir  # noqa: F401 - the fake engines' fixtures
from tests.entrypoints.fake_engine import FakeEngine, RecordingProcessor, fake_front_end
from tests.entrypoints.speech_sample import speech
from tests.entrypoints.test_realtime import pcm16_pieces

RATE = 24000
DELTA = "conversation.item.input_audio_transcription.delta"
DONE = "conversation.item.input_audio_transcription.completed"


@pytest.fixture(scope="module")
def both(tiny_dir: Path, asr_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, object]]:
    """The server's URL, and the recogniser's pipeline."""
    import yaml

    from omnistage.entrypoints.openai.api_server import build_app
    from omnistage.families.qwen3_asr.family import PRESET
    from omnistage.pipeline.async_omni import AsyncOmni
    from omnistage.pipeline.runtime import PipelineOptions
    from tests.entrypoints.server_thread import ServerThread
    from tests.pipeline.specs import small_dict, write_spec

    folder = tmp_path_factory.mktemp("stages")
    data = yaml.safe_load(PRESET.read_text())
    data["stages"][0]["engine"].update(num_kv_blocks=256, max_num_seqs=8)
    (folder / "asr.yaml").write_text(yaml.safe_dump(data))
    omni = AsyncOmni(tiny_dir, write_spec(folder, small_dict()), PipelineOptions(in_process=True), "tiny")
    asr = AsyncOmni(asr_dir, folder / "asr.yaml", PipelineOptions(in_process=True), "asr")
    thread = ServerThread(build_app(omni, recogniser_engine=asr))
    try:
        yield thread.start(), asr
    finally:
        thread.stop()
        asyncio.run(omni.shutdown())
        asyncio.run(asr.shutdown())


def _wav(samples: np.ndarray, rate: int) -> bytes:
    out = io.BytesIO()
    sf.write(out, samples, rate, format="WAV", subtype="PCM_16")
    return out.getvalue()


@pytest.mark.e2e
def test_both_models_are_served_and_a_transcription_names_one(both: tuple[str, object], asr_dir: Path) -> None:
    from tests.families.qwen3_asr.test_server import _expected

    both_url = both[0]
    client = openai.OpenAI(base_url=f"{both_url}/v1", api_key="unused", max_retries=0, timeout=60)
    assert {m.id for m in client.models.list()} == {"tiny", "asr"}
    assert client.models.retrieve("asr").id == "asr"
    samples, _ = speech("Hello world, this is a test.", 16000)
    reply = client.audio.transcriptions.create(model="asr", file=("a.wav", _wav(samples, 16000)), language="en")
    heard, _ = sf.read(io.BytesIO(_wav(samples, 16000)), dtype="float32")
    assert reply.text and reply.text == _expected(asr_dir, heard, "en")
    assert client.audio.transcriptions.create(model="tiny", file=("a.wav", _wav(samples, 16000))).text is not None


async def _spoken_turn(url: str, writer: str = "asr") -> list[dict]:
    """A speech-to-speech session whose turns the recogniser writes down: server VAD, speech paced like a
    microphone, until the answer is done and the turn's transcript is complete."""
    samples, _ = speech("The quick brown fox jumps over the lazy dog, and then it runs far away.", RATE)
    client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
    seen: list[dict] = []
    async with client.realtime.connect(model="tiny") as conn:
        await conn.session.update(session={"type": "realtime", "output_modalities": ["text"], "audio": {"input": {
            "transcription": {"model": writer, "language": "en"},
            "turn_detection": {"type": "server_vad", "silence_duration_ms": 500}}}})

        async def speak() -> None:
            for piece in pcm16_pieces(np.concatenate([samples, np.zeros(int(1.2 * RATE), np.float32)]), RATE):
                await conn.input_audio_buffer.append(audio=piece)
                await asyncio.sleep(0.05)

        talking = asyncio.create_task(speak())
        async for event in conn:
            seen.append(event.model_dump())
            kinds = {e["type"] for e in seen}
            if DONE in kinds and "response.done" in kinds:
                break
        await talking
    return seen


@pytest.mark.e2e
def test_a_spoken_session_names_the_recogniser_for_its_transcription(both: tuple[str, object]) -> None:
    url, asr = both
    before = _bytes_to(asr)
    seen = asyncio.run(asyncio.wait_for(_spoken_turn(url), 180))
    kinds = [e["type"] for e in seen]
    item = next(e["item_id"] for e in seen if e["type"] == "input_audio_buffer.committed")
    early = [e for e in seen[:kinds.index("input_audio_buffer.committed")] if e["type"] == DELTA]
    assert early and all(e["item_id"] == item for e in early), kinds
    deltas = "".join(e["delta"] for e in seen if e["type"] == DELTA and e["item_id"] == item)
    done = next(e for e in seen if e["type"] == DONE)
    assert done["transcript"] and done["transcript"] == deltas.strip()
    answer = next(e for e in seen if e["type"] == "response.done")["response"]  # the omni model answered
    assert answer["status"] in ("completed", "incomplete") and answer["output"][0]["content"][0]["text"]
    assert _bytes_to(asr) > before  # the recogniser's own pipeline wrote the turn down


@pytest.mark.e2e
def test_the_omni_thinker_writes_a_spoken_turn_down_while_it_is_spoken(both: tuple[str, object]) -> None:
    """The same session with the omni model's own thinker as its transcription model (any name but the
    recogniser's, as OpenAI's ``whisper-1``): deltas before the commit, joined into ``.completed``."""
    url, asr = both
    before = _bytes_to(asr)
    seen = asyncio.run(asyncio.wait_for(_spoken_turn(url, "whisper-1"), 180))
    kinds = [e["type"] for e in seen]
    item = next(e["item_id"] for e in seen if e["type"] == "input_audio_buffer.committed")
    assert DELTA in kinds[:kinds.index("input_audio_buffer.committed")], kinds
    deltas = "".join(e["delta"] for e in seen if e["type"] == DELTA and e["item_id"] == item)
    assert next(e for e in seen if e["type"] == DONE)["transcript"] == deltas.strip()
    assert _bytes_to(asr) == before  # the recogniser was not asked


@pytest.mark.e2e
def test_a_session_opened_on_the_recogniser_transcribes(both: tuple[str, object]) -> None:
    """``?model=`` naming the recogniser (the SDK's ``connect(model=...)``) opens a transcription session that
    it writes down."""
    async def created() -> dict:
        client = openai.AsyncOpenAI(base_url=f"{both[0]}/v1", api_key="unused", max_retries=0)
        async with client.realtime.connect(model="asr") as conn:
            async for event in conn:
                return event.model_dump()
        return {}

    session = asyncio.run(asyncio.wait_for(created(), 30))["session"]
    assert session["type"] == "transcription" and session["audio"]["input"]["transcription"]["model"] == "asr"


def _bytes_to(engine: object) -> int:
    return sum(r.bytes_sent for r in engine.stats().replicas)  # type: ignore[attr-defined]


def test_the_flags_name_a_second_pipeline(processor: RecordingProcessor) -> None:  # noqa: F811
    from omnistage.entrypoints.openai.serve_command import ready_banner

    args = build_parser().parse_args(["serve", "tiny", "--transcription-model", "/models/asr",
                                      "--transcription-served-model-name", "asr"])
    config = ServeConfig.from_args(args, environ={})
    assert "beside: 'asr', a speech recogniser" in ready_banner(config, FakeEngine(fake_front_end(processor)), 8000)
    pipeline = config.pipeline
    recogniser = pipeline.recogniser()
    assert recogniser is not None and recogniser.model == "/models/asr" and recogniser.model_name == "asr"
    assert recogniser.options == pipeline.options and recogniser.aligner is None
    plain = ServeConfig.from_args(build_parser().parse_args(["serve", "tiny"]), environ={}).pipeline
    assert plain.recogniser() is None


def test_both_pipelines_take_places_under_one_bound(processor: RecordingProcessor) -> None:  # noqa: F811
    omni, asr = FakeEngine(fake_front_end(processor)), FakeEngine(fake_front_end(processor))
    admission = Admission(omni, 2)
    beside = admission.beside(asr)
    first = beside.admit()
    admission.admit()
    with pytest.raises(Overloaded):
        beside.admit()
    with pytest.raises(Overloaded):
        admission.admit()
    first.release()
    assert beside.admitted == admission.admitted == 1
    beside.admit()
    assert admission.admitted == 2


class _Omni(FakeEngine):
    """A fake model whose report says which stages each output needs, as a real pipeline's does."""

    def health(self) -> HealthReport:
        return replace(super().health(), needs=((Modality.TEXT, frozenset({"thinker"})),
                                                (Modality.AUDIO, frozenset({"thinker", "talker", "code2wav"}))))


class _LostRecogniser(FakeEngine):
    def health(self) -> HealthReport:
        return HealthReport(stages=(StageHealth("recogniser", (ReplicaHealth(0, False, "process died"),)),),
                            needs=((Modality.TEXT, frozenset({"recogniser"})),))


def test_a_lost_recogniser_degrades_the_server_and_refuses_its_requests(
        processor: RecordingProcessor) -> None:  # noqa: F811
    from fastapi.testclient import TestClient

    from omnistage.entrypoints.openai.api_server import build_app

    asr = _LostRecogniser(fake_front_end(processor), model_name="asr")
    with TestClient(build_app(_Omni(fake_front_end(processor)), recogniser_engine=asr)) as client:
        health = client.get("/health")
        assert health.status_code == 200 and health.json()["status"] == "degraded"
        assert "recogniser" in [s["stage"] for s in health.json()["stages"]]
        assert client.get("/ready").json()["status"] == "degraded"
        samples, _ = speech("Hello.", 16000)
        refused = client.post("/v1/audio/transcriptions", data={"model": "asr"},
                              files={"file": ("a.wav", _wav(samples, 16000))})
        assert refused.status_code == 503 and "recogniser" in refused.json()["error"]["message"]
        served = client.post("/v1/audio/transcriptions", data={"model": "fake-omni"},
                             files={"file": ("a.wav", _wav(samples, 16000))})
        assert served.status_code == 200, served.text
