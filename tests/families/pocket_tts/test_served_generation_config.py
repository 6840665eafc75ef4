"""The checkpoint's generation_config.json drives the served flow head and EOS rule as transformers reads it:
``num_flow_steps`` Euler steps, ``eos_threshold`` and ``min_frames_before_eos``."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest
import soundfile as sf

from omnistage.families.pocket_tts.checkpoint import load_decoder, load_model
from omnistage.families.pocket_tts.config import PocketCheckpoint
from omnistage.families.pocket_tts.decoder_stream import StreamingLatentDecoder
from omnistage.families.pocket_tts.generate import FlowDefaults, FlowSampling, generate_latents
from omnistage.families.pocket_tts.make_tiny import make_tiny_pocket
from omnistage.families.pocket_tts.prompt import PocketTokenizer
from omnistage.families.pocket_tts.voices import read_latents
from tests.families.pocket_tts.test_served import TEXT, _client, serving

pytestmark = pytest.mark.e2e
KNOBS = {"num_flow_steps": 3, "eos_threshold": -1000.0, "min_frames_before_eos": 2}


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    folder = make_tiny_pocket(tmp_path_factory.mktemp("pocket"))
    (folder / "generation_config.json").write_text(json.dumps({"do_sample": False, "max_new_tokens": 30, **KNOBS}))
    with serving(folder) as url:
        yield url, folder


def test_the_knobs_are_read(served):
    _, folder = served
    assert FlowDefaults.from_folder(folder) == FlowDefaults(**KNOBS)


def test_eos_stops_and_euler_steps_as_configured(served):
    url, folder = served
    data = _client(url).audio.speech.create(model="pocket", voice="alba", input=TEXT, response_format="wav").content
    samples, _ = sf.read(io.BytesIO(data), dtype="float32")
    assert len(samples) == (2 + 1 + 2) * 1920  # frames 0-1 cannot end, frame 2 ends, 2 more (a 6-word text)
    ckpt = PocketCheckpoint.from_folder(folder)
    voice = read_latents(folder / "voices" / "alba.safetensors", 32)
    prompt = PocketTokenizer(folder, ckpt.model).prompt(TEXT, voice)
    latents = generate_latents(load_model(folder, ckpt), prompt.input_ids(ckpt.model),
                               FlowSampling(greedy=True, max_frames=30, frames_after_eos=2, **KNOBS), voice=voice)
    one_step = generate_latents(load_model(folder, ckpt), prompt.input_ids(ckpt.model),
                                FlowSampling(greedy=True, max_frames=30, frames_after_eos=2,
                                             **{**KNOBS, "num_flow_steps": 1}), voice=voice)
    assert (latents - one_step).abs().max() > 1e-3
    wav = StreamingLatentDecoder(load_decoder(folder, ckpt)).decode_streams(["s"], [0], [latents.T], [0], [True])[0]
    np.testing.assert_allclose(samples, np.clip(wav.numpy(), -1, 1), atol=2 / 32767)
