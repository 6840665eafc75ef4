"""Voices cloned from uploaded reference audio on a Qwen3-TTS Base checkpoint: registered under the folder the
operator names, listed, used by /v1/audio/speech (the same audio as cloning offline from that recording; another
recording, another voice), deleted; every limit and mistake a clear 4xx, behind the API key like every route."""

from __future__ import annotations

import asyncio
import base64
import io
import json
from pathlib import Path

import httpx
import numpy as np
import pytest
import soundfile as sf
import torch

from omnistage.entrypoints.openai.api_server import build_app
from omnistage.entrypoints.openai.server_config import AccessPolicy, ServerLimits, ServingOptions
from omnistage.models.qwen3_tts.checkpoint import Qwen3TTSModels
from omnistage.families.qwen3_tts.offline import TTSSettings, generate_offline
from omnistage.models.qwen3_tts.request import SpeechInput, TextTokenizer, make_voice_clone
from omnistage.pipeline.async_omni import AsyncOmni
from omnistage.pipeline.runtime import PipelineOptions
from omnistage.tools.verify.tts_compare import REF_TEXT, synthetic_voice
from tests.entrypoints.server_thread import ServerThread
from tests.pipeline.specs import tts_small_dict, write_spec

pytestmark = pytest.mark.e2e
FRAMES = 12
TEXT = "Hello there."
LIMITS = ServerLimits(max_voice_audio_bytes=200_000, max_voice_seconds=3.0, max_voices=2)


def _wav(samples: np.ndarray, rate: int = 24000) -> str:
    out = io.BytesIO()
    sf.write(out, samples, rate, format="WAV", subtype="PCM_16")
    return base64.b64encode(out.getvalue()).decode()


class _Served:
    def __init__(self, url: str, folder: Path, voices: Path) -> None:
        self.url, self.folder, self.voices = url, folder, voices

    def post(self, path: str, body: dict, **kwargs: object) -> httpx.Response:
        return httpx.post(f"{self.url}{path}", json=body, timeout=120, **kwargs)


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory):
    from omnistage.families.qwen3_tts.make_tiny import make_tiny_tts

    folder = make_tiny_tts(tmp_path_factory.mktemp("tts-base"), seed=0, tts_model_type="base")
    (folder / "generation_config.json").write_text(json.dumps(
        {"do_sample": False, "top_k": 50, "repetition_penalty": 1.05, "max_new_tokens": FRAMES}))
    voices = tmp_path_factory.mktemp("voices")
    engine = AsyncOmni(folder, write_spec(tmp_path_factory.mktemp("stages"), tts_small_dict()),
                       PipelineOptions(in_process=True), "tts")
    open_app = ServerThread(build_app(engine, LIMITS, serving=ServingOptions(voices_dir=voices)))
    keyed = ServerThread(build_app(engine, LIMITS, access=AccessPolicy(api_keys=("k",)),
                                   serving=ServingOptions(voices_dir=voices)))
    try:
        yield _Served(open_app.start(), folder, voices), keyed.start()
    finally:
        keyed.stop()
        open_app.stop()
        asyncio.run(engine.shutdown())


def _offline(folder: Path, recording: np.ndarray) -> torch.Tensor:
    models, tokenizer = Qwen3TTSModels.load(folder), TextTokenizer(folder)
    clone = make_voice_clone(models, tokenizer, recording, 24000, REF_TEXT)
    return generate_offline(models, tokenizer, SpeechInput(TEXT, voice_clone=clone),
                            TTSSettings(max_new_tokens=FRAMES)).wav


def _speak(served: _Served, voice: str) -> httpx.Response:
    return served.post("/v1/audio/speech", {"model": "tts", "input": TEXT, "voice": voice, "response_format": "wav"})


def test_a_registered_voice_speaks_as_cloning_it_offline(base) -> None:
    served, _ = base
    recording = synthetic_voice()
    r = served.post("/v1/audio/voices", {"name": "alice", "audio": {"data": _wav(recording), "format": "wav"},
                                         "transcript": REF_TEXT})
    assert r.status_code == 200, r.text
    assert r.json()["id"] == "alice" and r.json()["mode"] == "in_context"
    assert (served.voices / "alice" / "voice.safetensors").is_file()
    listed = httpx.get(f"{served.url}/v1/audio/voices", timeout=30).json()
    assert [v["id"] for v in listed["data"]] == ["alice"]
    spoken = _speak(served, "alice")
    assert spoken.status_code == 200, spoken.text
    samples, _ = sf.read(io.BytesIO(spoken.content), dtype="float32")
    torch.testing.assert_close(torch.from_numpy(samples), _offline(served.folder, recording), atol=1e-4, rtol=0)
    other = served.post("/v1/audio/voices", {"name": "bob", "audio": {"data": _wav(synthetic_voice(pitch=220.0,
                                                                                                 seed=1))},
                                             "transcript": REF_TEXT})
    assert other.status_code == 200, other.text
    bob, _ = sf.read(io.BytesIO(_speak(served, "bob").content), dtype="float32")
    assert bob.shape == samples.shape and not np.allclose(bob, samples, atol=1e-3)
    for name in ("alice", "bob"):
        assert httpx.delete(f"{served.url}/v1/audio/voices/{name}", timeout=30).json()["deleted"] is True
    assert _speak(served, "alice").json()["error"]["code"] == "invalid_voice"
    assert httpx.delete(f"{served.url}/v1/audio/voices/alice", timeout=30).status_code == 404


def test_limits_and_mistakes_are_clear_4xx(base) -> None:
    served, keyed = base
    audio = {"data": _wav(synthetic_voice(1.0)), "format": "wav"}

    def register(name: str, **body: object) -> httpx.Response:
        return served.post("/v1/audio/voices", {"name": name, "audio": audio, **body})

    assert register("x1").json()["mode"] == "x_vector"
    assert register("x1").status_code == 409
    assert register("x2").status_code == 200
    full = register("x3")
    assert full.status_code == 400 and full.json()["error"]["code"] == "too_many_voices"
    for name in ("x1", "x2"):
        httpx.delete(f"{served.url}/v1/audio/voices/{name}", timeout=30)
    assert register("../etc").json()["error"]["code"] == "invalid_voice_name"
    big = served.post("/v1/audio/voices", {"name": "big", "audio": {"data": "A" * 300_000}})
    assert big.status_code == 400 and "--max-voice-audio-bytes" in big.json()["error"]["message"]
    long = served.post("/v1/audio/voices", {"name": "long", "audio": {"data": _wav(synthetic_voice(3.5)[::3], 8000)}})
    assert long.status_code == 400 and long.json()["error"]["code"] == "audio_too_long"  # from the header
    assert "--max-voice-seconds" in long.json()["error"]["message"]
    junk = served.post("/v1/audio/voices", {"name": "junk", "audio": {"data": base64.b64encode(b"not audio").decode()}})
    assert junk.status_code == 400 and junk.json()["error"]["code"] == "invalid_audio"
    assert _speak(served, "nobody").json()["error"]["code"] == "invalid_voice"
    assert httpx.get(f"{keyed}/v1/audio/voices", timeout=30).status_code == 401
    authed = httpx.get(f"{keyed}/v1/audio/voices", headers={"Authorization": "Bearer k"}, timeout=30)
    assert authed.status_code == 200 and authed.json()["data"] == []
    assert sorted(p.name for p in served.voices.iterdir()) == []  # nothing half-written left behind


def test_a_recording_with_non_finite_samples_is_refused_at_upload(base) -> None:
    """A FLOAT WAV holding NaN was accepted (200), and every speech request in that voice then failed with 500
    "sampling failed" (issue 51, row 8): it is a 400 at upload, and nothing is stored."""
    served, _ = base
    for bad in (np.nan, np.inf):
        samples = synthetic_voice(1.0)
        samples[1000] = bad
        out = io.BytesIO()
        sf.write(out, samples, 24000, format="WAV", subtype="FLOAT")
        data = base64.b64encode(out.getvalue()).decode()
        r = served.post("/v1/audio/voices", {"name": "nan", "audio": {"data": data, "format": "wav"}})
        assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_audio", r.text
        assert "non-finite" in r.json()["error"]["message"]
        spoken = served.post("/v1/audio/speech", {"model": "tts", "input": TEXT, "ref_audio": f"data:audio/wav;base64,"
                                                  f"{data}", "x_vector_only_mode": True})
        assert spoken.status_code == 400 and "non-finite" in spoken.json()["error"]["message"], spoken.text
    assert sorted(p.name for p in served.voices.iterdir()) == []


def test_a_stored_voice_that_cannot_be_used_is_a_400_not_a_500(base) -> None:
    """A voice folder written before the upload check (its x-vector not finite) fails its requests as the
    client's mistake, naming the voice, not as "sampling failed"."""
    from safetensors.torch import load_file, save_file

    served, _ = base
    audio = {"data": _wav(synthetic_voice(1.0)), "format": "wav"}
    assert served.post("/v1/audio/voices", {"name": "broken", "audio": audio}).status_code == 200
    tensors = served.voices / "broken" / "voice.safetensors"
    save_file({"speaker_embedding": torch.full_like(load_file(str(tensors))["speaker_embedding"], float("nan"))},
              str(tensors))
    try:
        r = _speak(served, "broken")
        assert r.status_code == 400 and "not finite" in r.json()["error"]["message"], r.text
    finally:
        httpx.delete(f"{served.url}/v1/audio/voices/broken", timeout=30)


def test_an_unknown_voice_does_not_list_the_voices_others_registered(base) -> None:
    served, _ = base
    audio = {"data": _wav(synthetic_voice(1.0)), "format": "wav"}
    assert served.post("/v1/audio/voices", {"name": "secret-voice", "audio": audio}).status_code == 200
    try:
        error = _speak(served, "nobody").json()["error"]
        assert error["code"] == "invalid_voice" and "secret-voice" not in error["message"]
    finally:
        httpx.delete(f"{served.url}/v1/audio/voices/secret-voice", timeout=30)
