"""CSM served: /v1/audio/speech through the OpenAI SDK (whole files in every format, streamed bytes, SSE), in
OpenAI's shape (a speaker voice) and vLLM-Omni's (``ref_audio`` + ``ref_text``: a context turn), on a random
tiny checkpoint; the served audio is the offline generation's."""

from __future__ import annotations

import base64
import io
import json

import numpy as np
import openai
import pytest
import soundfile as sf
import torch

from omnistage.families.csm.checkpoint import load_codec, load_model
from omnistage.families.csm.config import CsmConfig
from omnistage.families.csm.prompt import CsmTokenizer
from omnistage.families.csm.runner import CsmRunner
from omnistage.families.csm.verify import greedy_frames
from tests.audio.signals import av_decode
from tests.families.speech_server import (
    openai_client,
    same_pcm,
    speak_concurrently_as_alone,
    sse_joins_to_the_whole,
    streamed_bytes_join_to_the_whole,
    ws_speaks_each_sentence,
)
from tests.families.speech_server import serving as served_as

pytestmark = pytest.mark.e2e
FRAMES = 9
TEXT = "hello there, how are you today"


def serving(folder, **app_options):  # noqa: ANN001
    return served_as(folder, "csm", **app_options)


@pytest.fixture(scope="module")
def served(csm_tiny):
    (csm_tiny / "generation_config.json").write_text(json.dumps({"do_sample": False, "max_new_tokens": FRAMES}))
    with serving(csm_tiny) as url:
        yield url, csm_tiny


def speak_offline(folder, speaker: int = 0, context=()) -> np.ndarray:
    """The utterance generated greedily and decoded offline on the same weights."""
    cfg = CsmConfig.from_folder(folder)
    prompt = CsmTokenizer(folder, cfg).prompt(TEXT, speaker, context)
    frames = greedy_frames(CsmRunner(load_model(folder, cfg)), prompt, FRAMES)
    return load_codec(folder, cfg, encoder=False).decode(frames.T[None])[0].numpy()


_client, _same_pcm = openai_client, same_pcm


def _wav(samples: np.ndarray) -> str:
    buf = io.BytesIO()
    sf.write(buf, samples, 24000, format="WAV", subtype="FLOAT")
    return "data:audio/wav;base64," + base64.b64encode(buf.getvalue()).decode()


def test_wav_is_the_offline_generation(served):
    url, folder = served
    data = _client(url).audio.speech.create(model="csm", voice="alloy", input=TEXT, response_format="wav").content
    samples, rate = sf.read(io.BytesIO(data), dtype="float32")
    offline = speak_offline(folder)
    assert rate == 24000 and len(samples) == FRAMES * 1920 and np.abs(offline).max() > 0.05
    np.testing.assert_allclose(samples, np.clip(offline, -1, 1), atol=2 / 32767)  # pcm16 rounding


def test_each_speaker_is_its_own_voice(served):
    url, folder = served
    client = _client(url)
    zero, one = (client.audio.speech.create(model="csm", voice=v, input=TEXT, response_format="pcm").content
                 for v in ("0", "1"))
    assert zero != one
    samples = np.frombuffer(one, "<i2").astype(np.float32) / 32767
    np.testing.assert_allclose(samples, np.clip(speak_offline(folder, 1), -1, 1), atol=2 / 32767)


@pytest.mark.parametrize("fmt", ["mp3", "flac", "opus", "aac", "pcm"])
def test_every_format_carries_the_audio(served, fmt):
    url, _ = served
    data = _client(url).audio.speech.create(model="csm", voice="alloy", input=TEXT, response_format=fmt).content
    if fmt == "pcm":
        assert len(data) == FRAMES * 1920 * 2
    else:
        samples, rate = av_decode(data)
        assert abs(len(samples) / rate - FRAMES * 0.08) < 0.1  # encoder frame padding; opus is 48 kHz


def test_streamed_sse_deltas_join_to_the_whole(served):
    sse_joins_to_the_whole(served[0], "csm", "alloy", TEXT)


def test_streamed_bytes(served):
    streamed_bytes_join_to_the_whole(served[0], "csm", "alloy", TEXT)


def test_ref_audio_is_a_context_turn(served):
    """vLLM-Omni's shape: the recording and its transcript become the turn the text continues."""
    url, folder = served
    reference = (np.random.default_rng(0).standard_normal(3 * 1920 + 200) * 0.3).clip(-1, 1).astype(np.float32)
    client = _client(url)
    data = client.audio.speech.create(model="csm", voice="alloy", input=TEXT, response_format="pcm",
                                      extra_body={"ref_audio": _wav(reference), "ref_text": "once upon a time"}
                                      ).content
    cfg = CsmConfig.from_folder(folder)
    codes = load_codec(folder, cfg).encode(torch.from_numpy(reference)[None], num_quantizers=32)[0].T
    from omnistage.families.csm.prompt import Segment

    offline = speak_offline(folder, 0, (Segment(0, "once upon a time", codes),))
    samples = np.frombuffer(data, "<i2").astype(np.float32) / 32767
    np.testing.assert_allclose(samples, np.clip(offline, -1, 1), atol=2 / 32767)
    with pytest.raises(openai.BadRequestError, match="transcript"):
        client.audio.speech.create(model="csm", voice="alloy", input=TEXT, extra_body={"ref_audio": _wav(reference)})


def test_bad_input_is_a_400(served):
    url, _ = served
    client = _client(url)
    with pytest.raises(openai.BadRequestError):
        client.audio.speech.create(model="csm", voice="alloy", input="   ")
    with pytest.raises(openai.BadRequestError):
        client.audio.speech.create(model="csm", voice="7", input=TEXT)


def test_speech_stream_websocket_speaks_each_sentence(served):
    ws_speaks_each_sentence(served[0], "csm", "1")


def test_concurrent_requests_each_speak_as_alone(served):
    speak_concurrently_as_alone(served[0], "csm", "1")