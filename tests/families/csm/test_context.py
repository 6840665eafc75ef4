"""CSM's conversational context over HTTP: ``/v1/audio/speech``'s ``context`` (earlier turns, each a speaker, its
text and its recording) is spoken after as the same segments offline, greedy; bad turns are 400s naming them."""

from __future__ import annotations

import base64
import io
import json

import httpx
import numpy as np
import pytest
import soundfile as sf
import torch

from omnistage.entrypoints.openai.server_config import ServerLimits
from omnistage.families.csm.checkpoint import load_codec
from omnistage.families.csm.config import CsmConfig
from omnistage.families.csm.prompt import Segment
from tests.families.csm.test_served import FRAMES, TEXT, serving, speak_offline

pytestmark = pytest.mark.e2e
TURNS = (("0", "how was the trip?"), ("1", "long, but the views were worth it"))


@pytest.fixture(scope="module")
def served(csm_tiny):
    (csm_tiny / "generation_config.json").write_text(json.dumps({"do_sample": False, "max_new_tokens": FRAMES}))
    with serving(csm_tiny, limits=ServerLimits(max_speech_context_turns=3, max_speech_context_seconds=4.0)) as url:
        yield url, csm_tiny


def _recording(seed: int, frames: float) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return (rng.standard_normal(int(frames * 1920)) * 0.3).clip(-1, 1).astype(np.float32)


def _data_url(samples: np.ndarray, rate: int = 24000) -> str:
    out = io.BytesIO()
    sf.write(out, samples, rate, format="WAV", subtype="FLOAT")
    return "data:audio/wav;base64," + base64.b64encode(out.getvalue()).decode()


def _speak(url: str, context: list[dict], voice: str = "1") -> httpx.Response:
    body = {"model": "csm", "input": TEXT, "voice": voice, "response_format": "pcm", "context": context}
    return httpx.post(f"{url}/v1/audio/speech", json=body, timeout=120)


def test_context_turns_are_the_offline_segments(served):
    url, folder = served
    recordings = [_recording(1, 3.5), _recording(2, 5.2)]
    context = [{"speaker": int(s) if i else s, "text": t, "audio": _data_url(r)}
               for i, ((s, t), r) in enumerate(zip(TURNS, recordings))]
    spoken = _speak(url, context)
    assert spoken.status_code == 200, spoken.text
    cfg = CsmConfig.from_folder(folder)
    codec = load_codec(folder, cfg)
    segments = tuple(Segment(int(s), t, codec.encode(torch.from_numpy(r)[None], num_quantizers=32)[0].T)
                     for (s, t), r in zip(TURNS, recordings))
    offline = speak_offline(folder, 1, segments)
    samples = np.frombuffer(spoken.content, "<i2").astype(np.float32) / 32767
    np.testing.assert_allclose(samples, np.clip(offline, -1, 1), atol=2 / 32767)  # pcm16 rounding
    without = _speak(url, [])  # the context changes what is said: not a test that would pass without it
    assert without.status_code == 200 and without.content != spoken.content


def _error(response: httpx.Response) -> dict:
    assert response.status_code == 400, response.text
    return response.json()["error"]


@pytest.mark.parametrize(("turn", "param", "code"), [
    ({"speaker": "7"}, "context[0].speaker", "invalid_speaker"),
    ({"audio": "data:audio/wav;base64,not*base64"}, "context[0].audio", "invalid_base64"),
    ({"audio": _data_url(np.full(4000, np.nan, np.float32))}, "context[0].audio", "invalid_audio"),
    ({"audio": _data_url(np.zeros(24000 * 5, np.float32))}, "context[0].audio", "audio_too_long"),
])
def test_a_bad_turn_is_a_400_naming_it(served, turn, param, code):
    good = {"speaker": "0", "text": "hi", "audio": _data_url(_recording(3, 4))}
    error = _error(_speak(served[0], [{**good, **turn}]))
    assert (error["param"], error["code"]) == (param, code), error


def test_the_turn_count_is_bounded_before_any_audio_is_read(served):
    turn = {"speaker": "0", "text": "hi", "audio": "data:audio/wav;base64,not*base64"}
    error = _error(_speak(served[0], [turn] * 4))
    assert "max-speech-context-turns" in error["message"] and error["param"] == "context[3]", error


def test_the_seconds_are_bounded_over_all_turns(served):
    turn = {"speaker": "0", "text": "hi", "audio": _data_url(np.zeros(24000 * 3, np.float32))}
    error = _error(_speak(served[0], [turn, turn]))
    assert (error["param"], error["code"]) == ("context[1].audio", "audio_too_long"), error
