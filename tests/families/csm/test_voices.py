"""CSM's voices through the voices API: a recording with its transcript registered once is the context turn every
request in that voice continues, as the same context offline; one without a transcript is refused."""

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
from omnistage.families.csm.checkpoint import load_codec
from omnistage.families.csm.config import CsmConfig
from omnistage.families.csm.make_tiny import make_tiny_csm
from omnistage.families.csm.prompt import Segment
from omnistage.families.csm.voices import read_voice
from omnistage.tools.verify.tts_compare import synthetic_voice
from tests.families.csm.test_served import FRAMES, TEXT, serving, speak_offline

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    folder = make_tiny_csm(tmp_path_factory.mktemp("csm"))
    (folder / "generation_config.json").write_text(json.dumps({"do_sample": False, "max_new_tokens": FRAMES}))
    voices = tmp_path_factory.mktemp("voices")
    with serving(folder, serving=ServingOptions(voices_dir=voices)) as url:
        yield url, folder, voices


def _wav(samples: np.ndarray) -> str:
    out = io.BytesIO()
    sf.write(out, samples, 24000, format="WAV", subtype="FLOAT")
    return base64.b64encode(out.getvalue()).decode()


def test_a_registered_voice_is_its_context_turn(served):
    url, folder, voices = served
    recording = synthetic_voice(1.2)
    body = {"name": "ann", "audio": {"data": _wav(recording), "format": "wav"}, "transcript": "Nice to meet you."}
    r = httpx.post(f"{url}/v1/audio/voices", json=body, timeout=120)
    assert r.status_code == 200, r.text
    spoken = httpx.post(f"{url}/v1/audio/speech", json={"model": "csm", "input": TEXT, "voice": "ann",
                                                         "response_format": "wav"}, timeout=120)
    assert spoken.status_code == 200, spoken.text
    samples, _ = sf.read(io.BytesIO(spoken.content), dtype="float32")
    cfg = CsmConfig.from_folder(folder)
    codes = load_codec(folder, cfg).encode(torch.from_numpy(recording)[None], num_quantizers=32)[0].T
    stored = read_voice(next(p for p in voices.rglob("context.json")).parent, 32)
    assert [(s.speaker, s.text) for s in stored.segments] == [(0, "Nice to meet you.")]
    assert torch.equal(stored.segments[0].codes, codes)
    offline = speak_offline(folder, 0, (Segment(0, "Nice to meet you.", codes),))
    np.testing.assert_allclose(samples, np.clip(offline, -1, 1), atol=2 / 32767)
    assert httpx.delete(f"{url}/v1/audio/voices/ann", timeout=30).json()["deleted"] is True


def test_a_voice_without_its_transcript_is_refused(served):
    url, _, _ = served
    body = {"name": "bob", "audio": {"data": _wav(synthetic_voice(1.0)), "format": "wav"}}
    r = httpx.post(f"{url}/v1/audio/voices", json=body, timeout=120)
    assert r.status_code == 400 and "transcript" in r.json()["error"]["message"], r.text
