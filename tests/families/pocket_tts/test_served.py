"""Pocket TTS served: /v1/audio/speech through the OpenAI SDK (whole files in every format, streamed bytes, SSE)
and the speech WebSocket, on a random tiny checkpoint; the served audio is the offline generation's."""

from __future__ import annotations

import io
import json

import numpy as np
import openai
import pytest
import soundfile as sf
import torch

from omnistage.families.pocket_tts.checkpoint import load_decoder, load_model
from omnistage.families.pocket_tts.config import PocketCheckpoint
from omnistage.families.pocket_tts.decoder_stream import StreamingLatentDecoder
from omnistage.families.pocket_tts.generate import FlowSampling, generate_latents
from omnistage.families.pocket_tts.make_tiny import make_tiny_pocket
from omnistage.families.pocket_tts.prompt import PocketTokenizer
from omnistage.families.pocket_tts.voices import read_latents
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
    """A live server of ``folder`` (in-process stages) for the module's tests: its URL."""
    return served_as(folder, "pocket", **app_options)


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    folder = make_tiny_pocket(tmp_path_factory.mktemp("pocket"))
    (folder / "generation_config.json").write_text(json.dumps({"do_sample": False, "max_new_tokens": FRAMES}))
    with serving(folder) as url:
        yield url, folder


def speak_offline(folder, voice: torch.Tensor | None) -> np.ndarray:
    """The utterance generated and decoded offline on the same weights, in ``voice``."""
    ckpt = PocketCheckpoint.from_folder(folder)
    prompt = PocketTokenizer(folder, ckpt.model).prompt(TEXT, voice)
    latents = generate_latents(load_model(folder, ckpt), prompt.input_ids(ckpt.model),
                               FlowSampling(greedy=True, max_frames=FRAMES), voice=voice)
    return StreamingLatentDecoder(load_decoder(folder, ckpt)).decode_streams(
        ["s"], [0], [latents.T], [0], [True])[0].numpy()


@pytest.fixture(scope="module")
def offline(served) -> np.ndarray:
    _, folder = served
    return speak_offline(folder, read_latents(folder / "voices" / "alba.safetensors", 32))  # alloy: the default


_client, _same_pcm = openai_client, same_pcm


def test_wav_is_the_offline_generation(served, offline):
    url, _ = served
    data = _client(url).audio.speech.create(model="pocket", voice="alloy", input=TEXT, response_format="wav").content
    samples, rate = sf.read(io.BytesIO(data), dtype="float32")
    assert rate == 24000 and len(samples) == FRAMES * 1920
    np.testing.assert_allclose(samples, np.clip(offline, -1, 1), atol=2 / 32767)  # pcm16 rounding


@pytest.mark.parametrize("fmt", ["mp3", "flac", "opus", "aac", "pcm"])
def test_every_format_carries_the_audio(served, offline, fmt):
    url, _ = served
    data = _client(url).audio.speech.create(model="pocket", voice="alloy", input=TEXT, response_format=fmt).content
    if fmt == "pcm":
        samples = np.frombuffer(data, "<i2").astype(np.float32) / 32767
        np.testing.assert_allclose(samples, np.clip(offline, -1, 1), atol=2 / 32767)
    else:
        samples, rate = av_decode(data)
        assert abs(len(samples) / rate - len(offline) / 24000) < 0.1  # encoder frame padding; opus is 48 kHz


def test_streamed_sse_deltas_join_to_the_whole(served):
    sse_joins_to_the_whole(served[0], "pocket", "alloy", TEXT)


def test_streamed_bytes(served):
    streamed_bytes_join_to_the_whole(served[0], "pocket", "alloy", TEXT)


def test_empty_input_is_a_400(served):
    url, _ = served
    with pytest.raises(openai.BadRequestError):
        _client(url).audio.speech.create(model="pocket", voice="alloy", input="   ")


def test_speech_stream_websocket_speaks_each_sentence(served):
    ws_speaks_each_sentence(served[0], "pocket", "marius")


def test_concurrent_requests_each_speak_as_alone(served):
    speak_concurrently_as_alone(served[0], "pocket", "marius")