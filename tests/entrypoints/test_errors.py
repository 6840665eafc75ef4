"""Every client mistake is a 4xx in OpenAI's error shape, seen through the official client."""

from __future__ import annotations

from collections.abc import Callable

import httpx
import openai
import pytest

from tests.audio.signals import soundfile_bytes, tone
from tests.entrypoints.conftest import LiveServer
from tests.entrypoints.media_samples import b64, data_url, mp4_bytes, png_bytes

Body = dict[str, object]
USER = [{"role": "user", "content": "hi"}]
AUDIO_OUT = {"modalities": ["text", "audio"], "audio": {"voice": "ethan", "format": "wav"}}
_TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}


def _parts(*parts: dict[str, object]) -> Body:
    return {"messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}, *parts]}]}


def _audio_part(data: str, fmt: str = "wav") -> dict[str, object]:
    return {"type": "input_audio", "input_audio": {"data": data, "format": fmt}}


def _url_part(kind: str, url: str) -> dict[str, object]:
    return {"type": kind, kind: {"url": url}}


WAV_1S = soundfile_bytes(tone(440, 1.0, 16000), 16000)
# (case id, request fields, status, param, code)
CHAT_ERRORS: list[tuple[str, Callable[[LiveServer], Body], int, str | None, str | None]] = [
    ("unknown model", lambda s: {"model": "gpt-4o"}, 404, "model", "model_not_found"),
    ("bad base64", lambda s: _parts(_audio_part("not*base64!")), 400,
     "messages[0].content[1].input_audio.data", "invalid_base64"),
    ("undecodable audio", lambda s: _parts(_audio_part(b64(b"RIFF" + b"\0" * 100))), 400,
     "messages[0].content[1].input_audio.data", "invalid_audio"),
    ("mp3 that is not mp3", lambda s: _parts(_audio_part(b64(b"\0" * 500), "mp3")), 400,
     "messages[0].content[1].input_audio.data", "invalid_audio"),
    ("input format", lambda s: _parts(_audio_part(b64(WAV_1S), "ogg")), 400,
     "messages[0].content[1].input_audio.format", None),
    ("too-long audio", lambda s: _parts(_audio_part(b64(soundfile_bytes(tone(440, 6.0, 8000), 8000)))), 400,
     "messages[0].content[1].input_audio.data", "audio_too_long"),
    ("too much base64", lambda s: _parts(_audio_part("A" * 2_000_004)), 400,
     "messages[0].content[1].input_audio.data", "media_too_large"),
    ("unknown voice", lambda s: {**AUDIO_OUT, "audio": {"voice": "robot", "format": "wav"}}, 400,
     "audio.voice", "invalid_voice"),
    ("unknown output format", lambda s: {**AUDIO_OUT, "audio": {"voice": "ethan", "format": "ogg"}}, 400,
     "audio.format", None),
    ("speaker against voice", lambda s: {**AUDIO_OUT, "extra_body": {"speaker": "Chelsie"}}, 400, "speaker", None),
    ("params without audio", lambda s: {"audio": {"voice": "ethan", "format": "wav"}}, 400, "audio", None),
    ("too-long text", lambda s: {"messages": [{"role": "user", "content": "x" * 2001}]}, 400, "messages",
     "input_too_long"),
    ("past the context", lambda s: {"max_tokens": 5000}, 400, "max_tokens", "context_length_exceeded"),
    ("temperature", lambda s: {"temperature": 3.5}, 400, "temperature", None),
    ("top_p", lambda s: {"top_p": 0}, 400, "top_p", None),
    ("n with audio", lambda s: {**AUDIO_OUT, "n": 2}, 400, "n", None),
    ("n past the bound", lambda s: {"n": 17}, 400, "n", None),
    ("presence_penalty", lambda s: {"presence_penalty": 2.5}, 400, "presence_penalty", None),
    ("frequency_penalty", lambda s: {"frequency_penalty": -3}, 400, "frequency_penalty", None),
    ("top_logprobs past 20", lambda s: {"logprobs": True, "top_logprobs": 21}, 400, "top_logprobs", None),
    ("top_logprobs without logprobs", lambda s: {"top_logprobs": 2}, 400, None, None),
    ("tool_choice not a tool", lambda s: {"tools": [_TOOL], "tool_choice": {"type": "function",
                                                                             "function": {"name": "nope"}}},
     400, "tool_choice", None),
    ("tool message without its call id", lambda s: {"messages": [{"role": "tool", "content": "x"}]}, 400,
     "messages[0]", None),
    ("first chunk", lambda s: {"extra_body": {"initial_codec_chunk_frames": 0}}, 400, "initial_codec_chunk_frames",
     None),
    ("stops", lambda s: {"stop": ["a", "b", "c", "d", "e"]}, 400, "stop", None),
    ("audio in a silent video", lambda s: {**_parts(_url_part("video_url", data_url("video/mp4", mp4_bytes()))),
                                           "extra_body": {"mm_processor_kwargs": {"use_audio_in_video": True}}},
     400, "messages[0].content[1].video_url.url", "video_without_audio"),
    ("logit_bias", lambda s: {"logit_bias": {"5": 10}}, 400, None, None),
    ("json mode", lambda s: {"response_format": {"type": "json_object"}}, 400, None, None),
    ("template kwargs the server sets", lambda s: {"extra_body": {"chat_template_kwargs": {"tools": []}}}, 400,
     "chat_template_kwargs", None),
    ("unknown role", lambda s: {"messages": [{"role": "wizard", "content": "hi"}]}, 400, "messages[0].role", None),
    ("unknown part", lambda s: _parts({"type": "hologram"}), 400, "messages[0].content[1]", None),
    ("empty messages", lambda s: {"messages": []}, 400, "messages", None),
    ("image too large", lambda s: _parts(_url_part("image_url", data_url("image/png", png_bytes(600, 600)))), 400,
     "messages[0].content[1].image_url.url", "image_too_large"),
    ("not an image", lambda s: _parts(_url_part("image_url", data_url("image/png", b"nope"))), 400,
     "messages[0].content[1].image_url.url", "invalid_image"),
    ("not a video", lambda s: _parts(_url_part("video_url", data_url("video/mp4", b"\0" * 64))), 400,
     "messages[0].content[1].video_url.url", "invalid_video"),
    ("data url not base64", lambda s: _parts(_url_part("audio_url", "data:audio/wav,abc")), 400,
     "messages[0].content[1].audio_url.url", "invalid_url"),
    ("ftp url", lambda s: _parts(_url_part("audio_url", "ftp://example.com/a.wav")), 400,
     "messages[0].content[1].audio_url.url", "invalid_url"),
    ("remote fetch off", lambda s: _parts(_url_part("image_url", "https://example.com/a.png")), 400,
     "messages[0].content[1].image_url.url", "remote_media_disabled"),
    ("file url with a host", lambda s: _parts(_url_part("audio_url", "file://server/share/a.wav")), 400,
     "messages[0].content[1].audio_url.url", "invalid_url"),
    ("file outside folder", lambda s: _parts(_url_part("audio_url", "file:///etc/hostname")), 400,
     "messages[0].content[1].audio_url.url", "file_not_available"),
    ("missing file", lambda s: _parts(_url_part("audio_url", (s.media_dir / "nope.wav").as_uri())), 400,
     "messages[0].content[1].audio_url.url", "file_not_available"),
    ("NUL in a file path", lambda s: _parts(_url_part("audio_url", (s.media_dir / "a").as_uri() + "%00.wav")), 400,
     "messages[0].content[1].audio_url.url", "invalid_url"),
    ("too many media", lambda s: _parts(*[_audio_part(b64(WAV_1S))] * 5), 400, "messages", "too_many_media_items"),
]


@pytest.mark.parametrize(("case", "fields", "status", "param", "code"), CHAT_ERRORS, ids=[c[0] for c in CHAT_ERRORS])
def test_chat_errors(server: LiveServer, case: str, fields: Callable[[LiveServer], Body], status: int,
                     param: str | None, code: str | None) -> None:
    body: Body = {"model": "fake-omni", "messages": USER, **fields(server)}
    with pytest.raises(openai.APIStatusError) as info:
        server.client().chat.completions.create(**body)
    error = info.value
    assert error.status_code == status, error.body
    assert set(error.body) == {"message", "type", "param", "code"}
    assert error.body["type"] == "invalid_request_error"
    assert error.body["param"] == param
    assert error.body["code"] == code
    assert error.body["message"]
    assert not server.engine.requests, "a refused request must not reach the engine"


def test_audio_not_supported(server: LiveServer) -> None:
    server.engine.supports_audio = False
    with pytest.raises(openai.BadRequestError) as info:
        server.client().chat.completions.create(model="fake-omni", messages=USER, **AUDIO_OUT)
    assert info.value.body["code"] == "audio_not_supported"


def test_symlink_out_of_the_folder_is_refused(server: LiveServer) -> None:
    link = server.media_dir / "escape.wav"
    if not link.exists():
        link.symlink_to("/etc/hostname")
    with pytest.raises(openai.BadRequestError) as info:
        server.client().chat.completions.create(
            model="fake-omni", messages=_parts(_url_part("audio_url", link.as_uri()))["messages"])
    assert info.value.body["code"] == "file_not_available"


def test_local_files_are_no_existence_oracle(server: LiveServer) -> None:
    """A missing file, a file outside the folder, a folder and a link out of it get the same answer, which
    names no path."""
    (server.media_dir / "sub").mkdir(exist_ok=True)
    link = server.media_dir / "escape2.wav"
    if not link.exists():
        link.symlink_to("/etc/hostname")
    answers = set()
    for uri in ("file:///etc/hostname", "file:///etc/no-such-file", (server.media_dir / "nope.wav").as_uri(),
                (server.media_dir / "sub").as_uri(), link.as_uri(), "file:///proc/self/environ"):
        with pytest.raises(openai.BadRequestError) as info:
            server.client().chat.completions.create(
                model="fake-omni", messages=_parts(_url_part("audio_url", uri))["messages"])
        body = info.value.body
        answers.add((body["code"], body["message"]))
        assert "/etc" not in body["message"] and str(server.media_dir) not in body["message"]
    assert len(answers) == 1, answers


@pytest.mark.parametrize(("content", "expected"), [
    (b"{not json", "not valid JSON"), (b'{"model": "fake-omni"}', "messages"),
])
def test_malformed_bodies_are_400_not_422(server: LiveServer, content: bytes, expected: str) -> None:
    resp = httpx.post(f"{server.base_url}/v1/chat/completions", content=content,
                      headers={"content-type": "application/json"})
    assert resp.status_code == 400
    assert expected in resp.json()["error"]["message"]


def test_unknown_route_and_method_keep_the_shape(server: LiveServer) -> None:
    missing = httpx.get(f"{server.base_url}/v1/nothing-here")
    assert missing.status_code == 404 and missing.json()["error"]["type"] == "invalid_request_error"
    wrong = httpx.get(f"{server.base_url}/v1/chat/completions")
    assert wrong.status_code == 405 and "error" in wrong.json()


SPEECH_ERRORS: list[tuple[str, Body, int, str | None, str | None]] = [
    ("unknown model", {"model": "tts-1"}, 404, "model", "model_not_found"),
    ("unknown voice", {"voice": "robot"}, 400, "voice", "invalid_voice"),
    ("unknown format", {"response_format": "ogg"}, 400, "response_format", None),
    ("speed too slow", {"speed": 0.2}, 400, "speed", None),
    ("speed out of range", {"speed": 9.0}, 400, "speed", None),
    ("too long", {"input": "x" * 201}, 400, "input", "input_too_long"),
    ("empty", {"input": ""}, 400, "input", None),
    ("stream format", {"stream_format": "websocket"}, 400, "stream_format", None),
]


@pytest.mark.parametrize(("case", "fields", "status", "param", "code"), SPEECH_ERRORS,
                         ids=[c[0] for c in SPEECH_ERRORS])
def test_speech_errors(server: LiveServer, case: str, fields: Body, status: int, param: str | None,
                       code: str | None) -> None:
    body: Body = {"model": "fake-omni", "voice": "ethan", "input": "Hello there.", **fields}
    with pytest.raises(openai.APIStatusError) as info:
        server.client().audio.speech.create(**body)
    assert info.value.status_code == status
    assert info.value.body["param"] == param and info.value.body["code"] == code
    assert not server.engine.requests


def test_oversized_body_is_413(server: LiveServer) -> None:
    huge = [{"role": "user", "content": "x" * 4_100_000}]
    with pytest.raises(openai.APIStatusError) as info:
        server.client().chat.completions.create(model="fake-omni", messages=huge)
    assert info.value.status_code == 413 and info.value.body["code"] == "request_too_large"


def test_oversized_chunked_body_is_cut_off(server: LiveServer) -> None:
    def chunks():  # noqa: ANN202 - a body without Content-Length
        yield b'{"model": "fake-omni", "messages": [{"role": "user", "content": "'
        for _ in range(50):
            yield b"x" * 100_000
        yield b'"}]}'

    resp = httpx.post(f"{server.base_url}/v1/chat/completions", content=chunks(),
                      headers={"content-type": "application/json"})
    assert resp.status_code == 413
    assert resp.json()["error"]["code"] == "request_too_large"
    assert not server.engine.requests
