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


def _b64_wav(samples: np.ndarray) -> str:
    return _data_url(samples).split(",", 1)[1]


def _chat(url: str, messages: list[dict], **extra) -> httpx.Response:  # noqa: ANN003
    body = {"model": "csm", "modalities": ["audio"], "audio": {"voice": "1", "format": "wav"}, "messages": messages,
            **extra}
    return httpx.post(f"{url}/v1/chat/completions", json=body, timeout=120)


def _conversation(recordings: list[np.ndarray]) -> list[dict]:
    """A user turn (the other side: speaker 0) and an assistant turn (the reply's speaker, 1), then the text."""
    turns = [{"role": role, "content": [{"type": "text", "text": text},
                                        {"type": "input_audio", "input_audio": {"data": _b64_wav(r), "format": "wav"}}]}
             for role, (_, text), r in zip(("user", "assistant"), TURNS, recordings)]
    return [{"role": "system", "content": "skipped: nothing a speech model hears"}, *turns,
            {"role": "user", "content": TEXT}]


def test_chat_messages_are_the_offline_segments(served):
    url, folder = served
    recordings = [_recording(4, 3.5), _recording(5, 4.2)]
    reply = _chat(url, _conversation(recordings))
    assert reply.status_code == 200, reply.text
    message = reply.json()["choices"][0]["message"]
    assert message["audio"]["transcript"] == TEXT and message["content"] is None
    samples, rate = sf.read(io.BytesIO(base64.b64decode(message["audio"]["data"])), dtype="float32")
    cfg = CsmConfig.from_folder(folder)
    codec = load_codec(folder, cfg)
    segments = tuple(Segment(int(s), t, codec.encode(torch.from_numpy(r)[None], num_quantizers=32)[0].T)
                     for (s, t), r in zip(TURNS, recordings))
    assert rate == 24000
    np.testing.assert_allclose(samples, np.clip(speak_offline(folder, 1, segments), -1, 1), atol=2 / 32767)


def test_chat_streams_the_same_audio(served):
    url, _ = served
    messages = _conversation([_recording(4, 3.5), _recording(5, 4.2)])
    whole = _chat(url, messages, audio={"voice": "1", "format": "pcm16"}).json()["choices"][0]["message"]["audio"]
    streamed = b""
    with httpx.stream("POST", f"{url}/v1/chat/completions", timeout=120, json={
            "model": "csm", "modalities": ["audio"], "audio": {"voice": "1", "format": "pcm16"}, "stream": True,
            "messages": messages}) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                delta = json.loads(line[6:])["choices"][0]["delta"] if json.loads(line[6:])["choices"] else {}
                streamed += base64.b64decode(delta.get("audio", {}).get("data", ""))
    assert len(streamed) > 0
    np.testing.assert_allclose(np.frombuffer(streamed, "<i2"), np.frombuffer(base64.b64decode(whole["data"]), "<i2"),
                               atol=1)


@pytest.mark.parametrize(("change", "param"), [
    (lambda m: m[-1].update(content=m[1]["content"]), "messages[3].content"),  # audio in the text to speak
    (lambda m: m[1].update(content="no audio"), "messages[1].content"),
    (lambda m: m[2].update(name="7"), "messages[2].name"),
    (lambda m: m[2].update(audio={"id": "audio_1"}), "messages[2].audio"),
    (lambda m: m[1]["content"][1]["input_audio"].update(data="not*base64"), "messages[1].audio"),
])
def test_a_bad_chat_turn_is_a_400_naming_it(served, change, param):
    messages = _conversation([_recording(4, 3.5), _recording(5, 4.2)])
    change(messages)
    assert _error(_chat(served[0], messages))["param"] == param


def test_chat_asks_for_audio(served):
    error = _error(_chat(served[0], [{"role": "user", "content": TEXT}], modalities=["text"]))
    assert error["code"] == "audio_required"
