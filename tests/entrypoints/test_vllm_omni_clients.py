"""vLLM-Omni's published clients, run unchanged (pinned copies under ``peer_clients/vllm_omni/``) as subprocesses
against live tiny servers, with only the host, port and model id changed: the Qwen3-Omni chat client (one choice
per modality), its realtime client (its own protocol on /v1/realtime), and the Qwen3-TTS speech, voice-cloning and
streaming clients."""

from __future__ import annotations

import asyncio
import io
import json
import os
import subprocess
import sys
import wave
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
import soundfile as sf

from omnistage.entrypoints.openai.api_server import build_app
from omnistage.entrypoints.openai.server_config import ServingOptions
from omnistage.pipeline.async_omni import AsyncOmni
from omnistage.pipeline.runtime import PipelineOptions
from omnistage.tools.verify.tts_compare import REF_TEXT, synthetic_voice
from tests.entrypoints.server_thread import ServerThread
from tests.pipeline.specs import small_dict, tts_small_dict, write_spec

pytestmark = pytest.mark.e2e
PEER = Path(__file__).parent / "peer_clients" / "vllm_omni"
CUSTOM_VOICE = "Qwen/Qwen3-TTS-12Hz-1.7B-CustomVoice"  # the ids the speech client hard-codes per task type
BASE = "Qwen/Qwen3-TTS-12Hz-1.7B-Base"
FRAMES = 12


def _run(script: str, *args: str, cwd: Path, env: dict[str, str] | None = None, source: Path | None = None,
         ) -> str:
    done = subprocess.run([sys.executable, str(source or PEER / script), *args], cwd=cwd, capture_output=True,
                          text=True, timeout=120, env={**os.environ, **(env or {})})
    assert done.returncode == 0, f"{script} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
    return done.stdout


def _serve(engine: AsyncOmni, serving: ServingOptions) -> Iterator[str]:
    thread = ServerThread(build_app(engine, serving=serving))
    try:
        yield thread.start()
    finally:
        thread.stop()
        asyncio.run(engine.shutdown())


@pytest.fixture(scope="module")
def omni(tiny_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    config = write_spec(tmp_path_factory.mktemp("stages"), small_dict(talker_frames=16))
    engine = AsyncOmni(tiny_dir, config, PipelineOptions(in_process=True, talker_min_new_tokens=8), "tiny")
    yield from _serve(engine, ServingOptions(default_modalities=("text", "audio")))


def _tts(tmp_path_factory: pytest.TempPathFactory, kind: str, name: str) -> Iterator[str]:
    from omnistage.families.qwen3_tts.make_tiny import make_tiny_tts

    folder = make_tiny_tts(tmp_path_factory.mktemp(kind), seed=0, tts_model_type=kind)
    (folder / "generation_config.json").write_text(json.dumps(
        {"do_sample": False, "top_k": 50, "repetition_penalty": 1.05, "max_new_tokens": FRAMES}))
    engine = AsyncOmni(folder, write_spec(tmp_path_factory.mktemp("stages"), tts_small_dict()),
                       PipelineOptions(in_process=True), "tts")
    yield from _serve(engine, ServingOptions(served_model_names=(name,)))


@pytest.fixture(scope="module")
def custom_voice(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    yield from _tts(tmp_path_factory, "custom_voice", CUSTOM_VOICE)


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    yield from _tts(tmp_path_factory, "base", BASE)


def _wav_frames(path: Path) -> int:
    samples, rate = sf.read(io.BytesIO(path.read_bytes()), dtype="float32")
    assert rate == 24000
    return len(samples)


# ---- Qwen3-Omni -----------------------------------------------------------------------------------------


def test_chat_client_gets_one_choice_per_modality(omni: str, tmp_path: Path) -> None:
    """Its client prints the text of a text choice and saves the audio of an audio choice; it sends
    sampling_params_list, which says it is a vLLM-Omni client. Its base URL is a constant: only the port changes."""
    source = tmp_path / "client.py"
    text = (PEER / "openai_chat_completion_client_for_multimodal_generation.py").read_text()
    source.write_text(text.replace("http://localhost:8091/v1", f"{omni}/v1"))
    out = _run("chat", "--query-type", "text", "--model", "tiny", cwd=tmp_path, source=source,
               env={"PYTHONPATH": str(PEER / "vllm_shim")})
    assert "Chat completion output from text:" in out and "Audio saved to audio_0.wav" in out, out
    assert _wav_frames(tmp_path / "audio_0.wav") > 0


def test_openai_clients_keep_one_choice(omni: str) -> None:
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    plain = httpx.post(f"{omni}/v1/chat/completions", json=body, timeout=60).json()
    assert len(plain["choices"]) == 1 and plain["choices"][0]["message"]["audio"]["data"]
    asked = httpx.post(f"{omni}/v1/chat/completions", json={**body, "choice_per_modality": True}, timeout=60).json()
    assert [c["index"] for c in asked["choices"]] == [0, 1]
    assert asked["choices"][0]["message"]["audio"] is None and asked["choices"][1]["message"]["content"] is None


def test_realtime_client_speaks_its_protocol(omni: str, tmp_path: Path) -> None:
    recording = synthetic_voice(1.0)[::3]  # 24 kHz → 16 kHz, what its client insists on
    with wave.open(str(tmp_path / "in.wav"), "wb") as wf:
        wf.setnchannels(1), wf.setsampwidth(2), wf.setframerate(16000)
        wf.writeframes((np.clip(recording, -1, 1) * 32767).astype("<i2").tobytes())
    out = _run("openai_realtime_client.py", "--url", f"{omni.replace('http', 'ws')}/v1/realtime",
               "--model", "tiny", "--input-wav", "in.wav", "--output-wav", "out.wav", "--output-text", "out.txt",
               cwd=tmp_path)
    assert "Final transcription:" in out and "Saved realtime audio" in out, out
    with wave.open(str(tmp_path / "out.wav")) as wf:
        assert wf.getframerate() == 24000 and wf.getnframes() > 0
    assert (tmp_path / "out.txt").read_text()


# ---- Qwen3-TTS --------------------------------------------------------------------------------------------


def test_speech_client_on_custom_voice(custom_voice: str, tmp_path: Path) -> None:
    out = _run("openai_speech_client.py", "--api-base", custom_voice, "--text", "Hello there.",
               "--language", "English", "--max-new-tokens", "6", cwd=tmp_path)
    assert "Audio saved to: tts_output.wav" in out, out
    assert 0 < _wav_frames(tmp_path / "tts_output.wav") <= 6 * 1920  # 1920 samples a codec frame
    listed = httpx.get(f"{custom_voice}/v1/audio/voices", timeout=30).json()
    assert {"vivian", "ryan"} <= set(listed["voices"])
    # model and voice may be left out: the served ones.
    r = httpx.post(f"{custom_voice}/v1/audio/speech", json={"input": "Hi.", "response_format": "wav"}, timeout=60)
    assert r.status_code == 200 and r.content[:4] == b"RIFF"
    wrong = httpx.post(f"{custom_voice}/v1/audio/speech", json={"input": "Hi.", "task_type": "Base"}, timeout=30)
    assert wrong.status_code == 400 and wrong.json()["error"]["param"] == "task_type"


@pytest.mark.parametrize("mode", [["--ref-text", REF_TEXT], ["--x-vector-only"]])
def test_speech_client_clones_from_ref_audio(base: str, tmp_path: Path, mode: list[str]) -> None:
    sf.write(tmp_path / "ref.wav", synthetic_voice(), 24000, subtype="PCM_16")
    out = _run("openai_speech_client.py", "--api-base", base, "--text", "Hello there.", "--task-type", "Base",
               "--ref-audio", "ref.wav", *mode, cwd=tmp_path)
    assert "Audio saved to: tts_output.wav" in out, out
    assert _wav_frames(tmp_path / "tts_output.wav") > 0


def test_streaming_speech_client(custom_voice: str, tmp_path: Path) -> None:
    out = _run("streaming_speech_client.py", "--url", f"{custom_voice.replace('http', 'ws')}/v1/audio/speech/stream",
               "--text", "Hello there. How are you today?", "--output-dir", "out", cwd=tmp_path)
    # Qwen3-TTS speaks text as it is written: the session's text is one utterance, told as one sentence.
    assert "Session complete: 1 sentence(s) generated" in out and "ERROR" not in out, out
    assert _wav_frames(tmp_path / "out" / "sentence_000.wav") > 0
