"""Every HTTP route fuzzed: a valid body of each with every field, at any depth, replaced by each other JSON type
(``json_mutations``), then hypothesis-drawn JSON at hypothesis-drawn places, garbage in every multipart field and
file, and schemathesis's negative mode over ``/openapi.json``. Each answer is a 2xx or an OpenAI-shaped 4xx
that shows no object repr, never a 5xx, and the server stays up.

Reproducible (``derandomize``) and bounded (``max_examples``): this file runs in seconds against the fake engine.
The realtime and speech-stream WebSocket events are fuzzed the same way in ``test_fuzz_events.py``.
"""

from __future__ import annotations

import io
import itertools
import json
import wave
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import httpx
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.errors import Unsatisfiable

from omnistage.entrypoints.openai.api_server import build_app
from omnistage.entrypoints.openai.server_config import ServingOptions
from omnistage.families.speech import SpeechAsk, SpeechFrontEnd
from omnistage.core import Prompt
from tests.entrypoints.conftest import TEST_LIMITS, LiveServer
from tests.entrypoints.fake_engine import FakeEngine, RecordingProcessor, fake_front_end
from tests.entrypoints.json_mutations import Json, mutations, variants
from tests.entrypoints.media_samples import b64, data_url, png_bytes
from tests.entrypoints.server_thread import ServerThread

FUZZ = settings(max_examples=30, deadline=None, derandomize=True, database=None,
                suppress_health_check=list(HealthCheck))


def wav_bytes(seconds: float = 0.2, rate: int = 16000, channels: int = 1) -> bytes:
    samples = (np.sin(np.arange(int(seconds * rate)) * 0.05) * 8000).astype(np.int16)
    out = io.BytesIO()
    with wave.open(out, "wb") as w:
        w.setnchannels(channels)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(np.repeat(samples, channels).tobytes())
    return out.getvalue()


WAV = wav_bytes()
CHAT: Json = {
    "model": "fake-omni", "max_tokens": 4, "temperature": 0.5, "top_p": 0.9, "top_k": 5, "seed": 1, "n": 1,
    "stop": ["zz"], "modalities": ["text", "audio"], "audio": {"voice": "Ethan", "format": "wav"},
    "logprobs": True, "top_logprobs": 2, "stream": False,
    "tool_choice": {"type": "function", "function": {"name": "f"}}, "parallel_tool_calls": True,
    "tools": [{"type": "function", "function": {"name": "f", "description": "d", "strict": False,
                                                "parameters": {"type": "object", "properties": {}}}}],
    "mm_processor_kwargs": {"use_audio_in_video": False},
    "messages": [
        {"role": "system", "content": "be brief"},
        {"role": "user", "name": "u", "content": [
            {"type": "text", "text": "hi"},
            {"type": "input_audio", "input_audio": {"data": b64(WAV), "format": "wav"}},
            {"type": "image_url", "image_url": {"url": data_url("image/png", png_bytes(16, 16)), "detail": "low"}},
        ]},
        {"role": "assistant", "content": None,
         "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{\"a\": 1}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "42"},
        {"role": "user", "content": "and?"},
    ],
}
RESPONSES: Json = {
    "model": "fake-omni", "instructions": "be brief", "max_output_tokens": 4, "temperature": 0.5, "top_p": 0.9,
    "store": False, "stream": False, "metadata": {"k": "v"}, "tool_choice": "auto",
    "text": {"format": {"type": "text"}}, "reasoning": {"effort": "low"}, "include": [], "seed": 3,
    "tools": [{"type": "function", "name": "f", "description": "d", "parameters": {"type": "object"}}],
    "input": [
        {"role": "user", "content": [{"type": "input_text", "text": "hi"},
                                     {"type": "input_image", "image_url": data_url("image/png", png_bytes(16, 16))},
                                     {"type": "input_audio", "input_audio": {"data": b64(WAV), "format": "wav"}}]},
        {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "42"},
    ],
}
SPEECH: Json = {"model": "fake-omni", "input": "Hello there.", "voice": "Ethan", "instructions": "calm",
                "response_format": "wav", "speed": 1.25, "stream_format": "audio", "language": "English",
                "max_new_tokens": 8, "stream": False, "x_vector_only_mode": False}
CLIENT_SECRET: Json = {
    "expires_after": {"anchor": "created_at", "seconds": 600},
    "session": {"type": "realtime", "model": "fake-omni", "instructions": "hi", "output_modalities": ["text"],
                "max_output_tokens": 16, "tool_choice": "auto",
                "tools": [{"type": "function", "name": "f", "parameters": {"type": "object"}}],
                "audio": {"input": {"format": {"type": "audio/pcm", "rate": 24000},
                                    "turn_detection": {"type": "server_vad", "threshold": 0.5,
                                                       "silence_duration_ms": 300, "prefix_padding_ms": 100}},
                          "output": {"format": {"type": "audio/pcmu"}, "voice": "Ethan"}}},
}
VOICE: Json = {"name": "v", "audio": {"data": b64(WAV), "format": "wav"}, "transcript": "hello"}
JSON_ROUTES = [("/v1/chat/completions", CHAT), ("/v1/responses", RESPONSES), ("/v1/audio/speech", SPEECH),
               ("/v1/realtime/client_secrets", CLIENT_SECRET),
               ("/v1/chat/completions", {**CHAT, "stream": True, "stream_options": {"include_usage": True}}),
               ("/v1/responses", {**RESPONSES, "stream": True})]
ROUTE_IDS = ["chat", "responses", "speech", "client_secrets", "chat-streamed", "responses-streamed"]
STREAM_ENDS = ("[DONE]", "response.completed", "response.incomplete", "response.failed")
NOT_FUZZED = frozenset({"model"})  # a wrong model is a 404 before anything else: it would hide the other fields
_names = itertools.count()


def problem(response: httpx.Response, what: str) -> str | None:
    """What is wrong with the answer to a hostile request, or None: a 5xx, or an error that is not OpenAI's shape
    or shows an object repr."""
    status, text = response.status_code, response.text
    if status >= 500:
        return f"{what}: {status} {text[:300]}"
    if status >= 400:
        try:
            message = json.loads(text)["error"]["message"]
        except (ValueError, KeyError, TypeError):
            return f"{what}: {status} is not an OpenAI error: {text[:200]}"
        if not isinstance(message, str) or " object at 0x" in message:
            return f"{what}: {status} error message {message!r:.200}"
    elif response.headers.get("content-type", "").startswith("text/event-stream") and \
            _last_event(text) not in STREAM_ENDS:
        return f"{what}: the stream was cut: ...{text[-200:]}"
    return None


def _last_event(sse: str) -> str:
    """The type of a stream's last event (``[DONE]`` for a chat stream's end)."""
    data = [line[len("data: "):] for line in sse.splitlines() if line.startswith("data: ")]
    if not data or data[-1] == "[DONE]":
        return "[DONE]" if data else ""
    try:
        return str(json.loads(data[-1]).get("type"))
    except (ValueError, AttributeError):
        return ""


def _post(client: httpx.Client, path: str, body: Json) -> httpx.Response:
    if isinstance(body, dict) and body.get("name") == "v":  # a voice name not yet taken, so the audio is read
        body = {**body, "name": f"v{next(_names)}"}
    return client.post(path, content=json.dumps(body), headers={"content-type": "application/json"})


def _still_up(base_url: str) -> None:
    assert httpx.get(f"{base_url}/health", timeout=10).status_code == 200
    assert httpx.get(f"{base_url}/v1/models", timeout=10).status_code == 200


class CloningFrontEnd(SpeechFrontEnd):
    """A speech front end that clones voices (as a Qwen3-TTS Base one does) without a model: the upload route's
    reading and decoding are real."""

    clones_voices = True

    def clone_voice(self, samples: np.ndarray, sample_rate: int, transcript: str | None) -> object:
        if samples.size == 0:
            raise ValueError("the reference audio is empty")
        return float(np.abs(samples).mean())

    def save_voice(self, voice: object, folder: Path) -> None:
        (folder / "voice.json").write_text(json.dumps(voice))

    def load_voice(self, folder: Path) -> object:
        return json.loads((folder / "voice.json").read_text())

    def prompt(self, ask: SpeechAsk) -> Prompt:
        raise ValueError("this fake front end only clones")

    def max_frames(self, prompt: Prompt, room: int) -> int:
        return room


@pytest.fixture(scope="module")
def voices_url(processor: RecordingProcessor, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    engine = FakeEngine(fake_front_end(processor, CloningFrontEnd()))
    limits = replace(TEST_LIMITS, max_voices=100_000)
    serving = ServingOptions(voices_dir=tmp_path_factory.mktemp("voices"))
    thread = ServerThread(build_app(engine, limits, serving=serving))
    yield thread.start()
    thread.stop()


def _fuzz_every_field(base_url: str, path: str, body: Json) -> list[str]:
    variants_ = mutations(body, skip=NOT_FUZZED)
    with httpx.Client(base_url=base_url, timeout=30) as client:
        assert _post(client, path, body).status_code == 200, "the base body must be valid"
        failures = [problem(_post(client, path, doc), f"{path} {what}") for what, doc in variants_]
    return [f for f in failures if f]


@pytest.mark.parametrize(("path", "body"), JSON_ROUTES, ids=ROUTE_IDS)
def test_every_field_of_every_json_route_with_every_wrong_type_is_a_4xx(server: LiveServer, path: str,
                                                                        body: Json) -> None:
    assert _fuzz_every_field(server.base_url, path, body) == []
    _still_up(server.base_url)


def test_every_field_of_a_voice_upload_with_every_wrong_type_is_a_4xx(voices_url: str) -> None:
    assert _fuzz_every_field(voices_url, "/v1/audio/voices", VOICE) == []
    _still_up(voices_url)


@pytest.mark.parametrize(("path", "body"), [*JSON_ROUTES, ("/v1/audio/voices", VOICE)],
                         ids=[*ROUTE_IDS, "voices"])
def test_arbitrary_json_anywhere_in_a_body_is_never_a_5xx(server: LiveServer, voices_url: str, path: str,
                                                          body: Json) -> None:
    base_url = voices_url if path == "/v1/audio/voices" else server.base_url
    failures: list[str] = []
    with httpx.Client(base_url=base_url, timeout=30) as client:
        @FUZZ
        @given(variant=variants(body))
        def check(variant: tuple[str, Json]) -> None:
            what, doc = variant
            failures.append(problem(_post(client, path, doc), f"{path} {what}") or "")
        check()
    assert [f for f in failures if f] == [] and len(failures) >= 10
    _still_up(base_url)


# ---- multipart ----------------------------------------------------------------------------------------

GARBAGE_FIELDS = ["", "-1", "1e999", "nan", "[]", "{\"a\": 1}", "x" * 5000, "\x00", "json\r\nX-Evil: 1", "\u202e"]
TRANSCRIPTION_FIELDS = {"model": "fake-omni", "language": "en", "prompt": "p", "response_format": "verbose_json",
                        "temperature": "0.2", "timestamp_granularities[]": "segment", "stream": "false",
                        "chunking_strategy": "auto"}
GARBAGE_FILES = [b"", b"RIFF", WAV[:60], WAV[:44] + b"\xff" * 100, b"\x00" * 4096,
                 b"fLaC\x00\x00\x00\x22" + b"\xff" * 64,
                 b"OggS" + b"\x00" * 60, b"ID3\x04" + b"\x00" * 60, wav_bytes(0.1, rate=8000, channels=2)]


def _multipart_cases() -> Iterator[tuple[str, dict[str, str], dict[str, tuple[str, bytes, str]] | None]]:
    audio = {"file": ("a.wav", WAV, "audio/wav")}
    for name in TRANSCRIPTION_FIELDS:
        for value in GARBAGE_FIELDS:
            yield f"{name}={value[:12]!r}", {**TRANSCRIPTION_FIELDS, name: value}, audio
    for i, data in enumerate(GARBAGE_FILES):
        yield f"file #{i}", TRANSCRIPTION_FIELDS, {"file": ("a.wav", data, "audio/wav")}
    yield "no file", TRANSCRIPTION_FIELDS, None
    yield "file as a text field", {**TRANSCRIPTION_FIELDS, "file": "abc"}, None
    yield "no model", {k: v for k, v in TRANSCRIPTION_FIELDS.items() if k != "model"}, audio


@pytest.mark.parametrize("path", ["/v1/audio/transcriptions", "/v1/audio/translations"])
def test_garbage_in_every_multipart_field_and_file_is_a_4xx(server: LiveServer, path: str) -> None:
    failures = []
    with httpx.Client(base_url=server.base_url, timeout=30) as client:
        assert client.post(path, data=TRANSCRIPTION_FIELDS, files={"file": ("a.wav", WAV, "audio/wav")}) \
            .status_code == 200
        for what, fields, files in _multipart_cases():
            failures.append(problem(client.post(path, data=fields, files=files), f"{path} {what}"))
        for raw in (b"--x\r\nContent-Disposition: form-data; name=\"file\"\r\n\r\n", b"not a form", b"--x--"):
            response = client.post(path, content=raw, headers={"content-type": "multipart/form-data; boundary=x"})
            failures.append(problem(response, f"{path} raw {raw[:20]!r}"))
    assert [f for f in failures if f] == []
    _still_up(server.base_url)


@FUZZ
@given(data=st.binary(max_size=2048))
def _random_file(client: httpx.Client, path: str, failures: list[str], data: bytes) -> None:
    response = client.post(path, data=TRANSCRIPTION_FIELDS, files={"file": ("a.bin", data, "audio/wav")})
    failures.append(problem(response, f"{path} file {data[:16]!r}") or "")


def test_random_bytes_as_the_audio_file_are_a_4xx(server: LiveServer) -> None:
    failures: list[str] = []
    with httpx.Client(base_url=server.base_url, timeout=30) as client:
        _random_file(client, "/v1/audio/transcriptions", failures)
    assert [f for f in failures if f] == [] and len(failures) >= 10


def test_garbage_call_offers_are_a_4xx(server: LiveServer) -> None:
    """``POST /v1/realtime/calls``: SDP offers and forms that are not what they claim."""
    cases: list[tuple[str, dict[str, object]]] = [
        ("empty sdp", {"content": b"", "headers": {"content-type": "application/sdp"}}),
        ("junk sdp", {"content": b"v=0\r\nm=audio x\r\n\xff", "headers": {"content-type": "application/sdp"}}),
        ("json", {"content": b"{}", "headers": {"content-type": "application/json"}}),
        ("no type", {"content": b"v=0"}),
    ]
    for session in ("", "[]", "{", "5", json.dumps({"type": 5}), json.dumps({"audio": {"output": {"voice": []}}})):
        cases.append((f"form session={session!r}", {"data": {"sdp": "v=0", "session": session}}))
    cases.append(("form without sdp", {"data": {"session": "{}"}}))
    cases.append(("form sdp as a file", {"files": {"sdp": ("o.sdp", b"v=0", "application/sdp")}}))
    with httpx.Client(base_url=server.base_url, timeout=30) as client:
        failures = [problem(client.post("/v1/realtime/calls", **kwargs), what) for what, kwargs in cases]
    assert [f for f in failures if f] == []
    _still_up(server.base_url)


# ---- schemathesis, negative mode ---------------------------------------------------------------------

def test_schemathesis_negative_cases_of_every_operation_are_never_a_5xx(server: LiveServer) -> None:
    """Bodies, paths and queries that break /openapi.json's own schema on purpose (the positive mode is in
    test_hostile_inputs.py)."""
    schemathesis = pytest.importorskip("schemathesis")

    schema = schemathesis.openapi.from_url(f"{server.base_url}/openapi.json")
    failures: list[str] = []
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) >= 15
    fuzzed = 0
    for operation in operations:
        @settings(max_examples=8, deadline=None, derandomize=True, database=None,
                  suppress_health_check=list(HealthCheck))
        @given(case=operation.as_strategy(generation_mode=schemathesis.GenerationMode.NEGATIVE))
        def check(case: object) -> None:
            response = case.call(base_url=server.base_url, timeout=30)
            failures.append(problem(response, f"{case.operation.label} {str(case.body)[:80]}") or "")

        try:
            check()
        except Unsatisfiable:
            continue  # nothing to get wrong (no body, no parameters: GET /health)
        fuzzed += 1
    assert [f for f in failures if f] == [] and fuzzed >= 6 and len(failures) >= 6 * 8, (fuzzed, len(failures))
    _still_up(server.base_url)
