"""Pocket TTS's voices served: the built-in ones by name, and one cloned from reference audio through the voices
API (the codec's encoder, as transformers encodes it), each speaking as the offline generation in that voice."""

from __future__ import annotations

import base64
import io
import json

import httpx
import numpy as np
import pytest
import soundfile as sf
import torch

from omnistage.entrypoints.openai.server_config import ServingOptions
from omnistage.families.pocket_tts.checkpoint import load_voice_encoder
from omnistage.families.pocket_tts.config import CODEC_FOLDER, PocketCheckpoint
from omnistage.families.pocket_tts.make_tiny import make_tiny_pocket
from omnistage.families.pocket_tts.voices import read_latents
from omnistage.tools.verify.tts_compare import synthetic_voice
from tests.families.pocket_tts.test_served import FRAMES, TEXT, serving, speak_offline

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    folder = make_tiny_pocket(tmp_path_factory.mktemp("pocket"))
    (folder / "generation_config.json").write_text(json.dumps({"do_sample": False, "max_new_tokens": FRAMES}))
    voices = tmp_path_factory.mktemp("voices")
    with serving(folder, serving=ServingOptions(voices_dir=voices)) as url:
        yield url, folder


def _speak(url: str, voice: str) -> httpx.Response:
    return httpx.post(f"{url}/v1/audio/speech", json={"model": "pocket", "input": TEXT, "voice": voice,
                                                       "response_format": "wav"}, timeout=120)


def _wav(samples: np.ndarray) -> str:
    out = io.BytesIO()
    sf.write(out, samples, 24000, format="WAV", subtype="FLOAT")
    return base64.b64encode(out.getvalue()).decode()


def test_builtin_voices_speak_as_offline(served):
    url, folder = served
    heard = {}
    for name in ("alba", "marius"):
        r = _speak(url, name)
        assert r.status_code == 200, r.text
        heard[name], _ = sf.read(io.BytesIO(r.content), dtype="float32")
        expected = speak_offline(folder, read_latents(folder / "voices" / f"{name}.safetensors", 32))
        np.testing.assert_allclose(heard[name], np.clip(expected, -1, 1), atol=2 / 32767)
    assert not np.allclose(heard["alba"], heard["marius"], atol=1e-3)
    assert _speak(url, "nobody").json()["error"]["code"] == "invalid_voice"


def test_a_cloned_voice_speaks_as_cloning_offline(served):
    url, folder = served
    recording = synthetic_voice(1.2)
    r = httpx.post(f"{url}/v1/audio/voices", json={"name": "ann", "audio": {"data": _wav(recording),
                                                                            "format": "wav"}}, timeout=120)
    assert r.status_code == 200, r.text
    assert r.json()["mode"] == "in_context"  # the recording prompts the backbone: there is no x-vector
    spoken = _speak(url, "ann")
    assert spoken.status_code == 200, spoken.text
    samples, _ = sf.read(io.BytesIO(spoken.content), dtype="float32")
    ckpt = PocketCheckpoint.from_folder(folder)
    latents = load_voice_encoder(folder, ckpt).encode(torch.from_numpy(recording))
    np.testing.assert_allclose(samples, np.clip(speak_offline(folder, latents), -1, 1), atol=2 / 32767)
    assert httpx.delete(f"{url}/v1/audio/voices/ann", timeout=30).json()["deleted"] is True


def test_encoder_matches_transformers(served):
    """The cloning encoder against transformers' feature extractor and ``encode`` (pause, padding, convs)."""
    transformers = pytest.importorskip("transformers")
    from transformers.models.pocket_tts.feature_extraction_pocket_tts import PocketTTSFeatureExtractor

    _, folder = served
    recording = torch.from_numpy(synthetic_voice(1.3, seed=2))
    ours = load_voice_encoder(folder, PocketCheckpoint.from_folder(folder)).encode(recording)
    codec = transformers.PocketTTSAudioTokenizerModel.from_pretrained(folder / CODEC_FOLDER).eval()
    inputs = PocketTTSFeatureExtractor()(recording, sampling_rate=24000)
    with torch.no_grad():
        out = codec.encode(inputs["input_values"], inputs["padding_mask"])
    theirs = out.latents[0, :int(out.latents_mask[0].sum())]
    torch.testing.assert_close(ours, theirs, atol=1e-4, rtol=0)
