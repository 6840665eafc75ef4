"""The WebSocket events fuzzed: every client event type of ``WS /v1/realtime`` and ``WS /v1/audio/speech/stream``
(both dialects), each field (any depth) replaced by every other JSON type, hypothesis-drawn JSON anywhere, and raw
frames that are not JSON objects at all.

A realtime session answers a bad event with an ``error`` event and keeps reading: a field of the wrong type (null
aside, which means "unset") draws an error, and after each hostile event a probe (an event that always draws an
error echoing its ``event_id``) must be answered on the same socket. A speech stream answers a bad event with an
``error`` event too and keeps reading: the text's done event sent after the hostile ones still ends the session
with its done event and a close with 1000; never a dropped connection, 1008 or 1011.
Every error is OpenAI-shaped and shows no object repr. Derandomized and bounded, like ``test_fuzz_routes.py``.
"""

from __future__ import annotations

import base64
import contextlib
import json

import numpy as np
import pytest
from hypothesis import given
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import ClientConnection, connect

from tests.entrypoints.conftest import LiveServer
from tests.entrypoints.json_mutations import Json, mutations, variants
from tests.entrypoints.test_fuzz_routes import FUZZ

TIMEOUT_S = 10
PCM = base64.b64encode((np.sin(np.arange(2400) * 0.05) * 8000).astype("<i2").tobytes()).decode()
ITEM = "item_fuzz"  # created before each hostile event, so retrieve/truncate/delete have something to name
SETUP: list[Json] = [
    {"type": "conversation.item.create",
     "item": {"id": ITEM, "type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]}},
    {"type": "input_audio_buffer.append", "audio": PCM},
]
PROBE = {"type": "conversation.item.retrieve", "item_id": "no_such_item", "event_id": "probe"}
REALTIME: dict[str, Json] = {
    "session.update": {"type": "session.update", "event_id": "e", "session": {
        "type": "realtime", "instructions": "be brief", "output_modalities": ["text"], "max_output_tokens": 8,
        "temperature": 0.8, "tool_choice": "auto", "truncation": "auto",
        "tools": [{"type": "function", "name": "f", "description": "d", "parameters": {"type": "object"}}],
        "audio": {"input": {"format": {"type": "audio/pcm", "rate": 24000}, "transcription": {"model": "m"},
                            "turn_detection": {"type": "server_vad", "threshold": 0.5, "silence_duration_ms": 300,
                                               "prefix_padding_ms": 100, "create_response": False}},
                  "output": {"format": {"type": "audio/pcm", "rate": 24000}, "voice": "Ethan", "speed": 1.0}}}},
    "input_audio_buffer.append": {"type": "input_audio_buffer.append", "event_id": "e", "audio": PCM},
    "input_audio_buffer.commit": {"type": "input_audio_buffer.commit", "event_id": "e"},
    "input_audio_buffer.clear": {"type": "input_audio_buffer.clear", "event_id": "e"},
    "conversation.item.create": {"type": "conversation.item.create", "event_id": "e", "previous_item_id": ITEM,
                                 "item": {"id": "item_new", "type": "message", "role": "user", "content": [
                                     {"type": "input_text", "text": "hi"}, {"type": "input_audio", "audio": PCM}]}},
    "conversation.item.create (tool output)": {
        "type": "conversation.item.create", "event_id": "e",
        "item": {"type": "function_call_output", "call_id": "c1", "output": "42"}},
    "conversation.item.retrieve": {"type": "conversation.item.retrieve", "event_id": "e", "item_id": ITEM},
    "conversation.item.truncate": {"type": "conversation.item.truncate", "event_id": "e", "item_id": ITEM,
                                   "content_index": 0, "audio_end_ms": 10},
    "conversation.item.delete": {"type": "conversation.item.delete", "event_id": "e", "item_id": ITEM},
    "response.create": {"type": "response.create", "event_id": "e", "response": {
        "output_modalities": ["text"], "instructions": "x", "max_output_tokens": 2, "conversation": "none",
        "metadata": {"k": "v"}, "tool_choice": "auto", "tools": [],
        "input": [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]}]}},
    "response.cancel": {"type": "response.cancel", "event_id": "e", "response_id": "resp_x"},
    "output_audio_buffer.clear": {"type": "output_audio_buffer.clear", "event_id": "e"},
}
RAW_FRAMES = ["", "not json", "[1, 2]", "\"s\"", "5", "null", "{\"type\": 5}", "{\"type\": null}",
              "{\"type\": \"\\ud800\"}", "{" * 5000 + "}" * 5000, "[" * 100_000 + "]" * 100_000,
              "{\"type\": \"input_audio_buffer.append\", \"audio\": " + "[" * 3000 + "]" * 3000 + "}",
              b"\x00\xff binary", b"{\"type\": \"session.update\"}"]


def error_problem(event: dict, what: str) -> str | None:
    """What is wrong with an error event: not OpenAI's shape, or an object repr in its message."""
    error = event.get("error")
    if not isinstance(error, dict) or not isinstance(error.get("message"), str):
        return f"{what}: malformed error event {str(event)[:200]}"
    if " object at 0x" in error["message"] or error.get("type") not in ("invalid_request_error", "server_error"):
        return f"{what}: error event {str(error)[:200]}"
    return None


def _realtime_url(server: LiveServer) -> str:
    return server.base_url.replace("http://", "ws://") + "/v1/realtime"


def _realtime_round(server: LiveServer, frame: str | bytes, what: str, must_fail: bool = False) -> list[str]:
    """Sends ``frame`` after the setup, then the probe; problems seen until the probe's error comes back (and,
    with ``must_fail``, the lack of an error event for ``frame``)."""
    with connect(_realtime_url(server), open_timeout=TIMEOUT_S, close_timeout=1) as ws:
        assert json.loads(ws.recv(TIMEOUT_S))["type"] == "session.created"
        for event in [*(json.dumps(e) for e in SETUP), frame, json.dumps(PROBE)]:
            ws.send(event)
        return errors_to_probe(ws, what, "event_id", must_fail)


def errors_to_probe(ws: ClientConnection, what: str, id_field: str, must_fail: bool) -> list[str]:
    """Reads ``ws`` up to the error answering the probe (its ``error[id_field]`` is "probe"): what is wrong with
    each error, a socket that closed or went quiet first, and (``must_fail``) no error for the hostile frame."""
    problems: list[str] = []
    errors = 0
    try:
        while True:
            event = json.loads(ws.recv(TIMEOUT_S))
            if event["type"] != "error":
                continue
            problems.append(error_problem(event, what) or "")
            if event["error"].get(id_field) == "probe":
                break
            errors += 1
    except ConnectionClosed as exc:
        problems.append(f"{what}: the socket closed ({exc}) instead of answering the next event")
    except TimeoutError:
        problems.append(f"{what}: no answer to the next event within {TIMEOUT_S} s")
    if must_fail and not errors:
        problems.append(f"{what}: taken without an error event")
    return [p for p in problems if p]


@pytest.mark.parametrize("name", list(REALTIME))
def test_every_field_of_every_realtime_event_with_every_wrong_type_is_an_error_event(server: LiveServer,
                                                                                     name: str) -> None:
    problems = _realtime_round(server, json.dumps(REALTIME[name]), f"{name} as given")
    for what, doc in mutations(REALTIME[name]):
        # null is "unset" for every optional field, and a tool's parameters are a JSON Schema shown to the model
        # as given: taken or refused, but never a dropped socket
        must_fail = " = null" not in what and ".parameters." not in what
        problems += _realtime_round(server, json.dumps(doc), f"{name} {what}", must_fail=must_fail)
    assert problems == []


def test_a_mistyped_session_field_fails_alone_while_the_others_apply(server: LiveServer) -> None:
    update = {"type": "session.update", "session": {"instructions": "kept", "temperature": "hot", "audio": {
        "input": 5, "output": {"voice": "Aiden", "speed": "fast"}}}}
    with connect(_realtime_url(server), open_timeout=TIMEOUT_S) as ws:
        assert json.loads(ws.recv(TIMEOUT_S))["type"] == "session.created"
        ws.send(json.dumps(update))
        events = [json.loads(ws.recv(TIMEOUT_S)) for _ in range(4)]
    errors = [e["error"] for e in events if e["type"] == "error"]
    assert [(e["code"], e["param"]) for e in errors] == [("invalid_type", "session.temperature"),
                                                         ("invalid_type", "session.audio.input"),
                                                         ("invalid_type", "session.audio.output.speed")]
    assert errors[0]["message"] == ("Invalid type for 'session.temperature': expected a number, but got a string "
                                    "instead.")
    session = events[-1]["session"]
    assert events[-1]["type"] == "session.updated" and session["instructions"] == "kept"
    assert session["audio"]["output"]["voice"] == "Aiden"


def test_arbitrary_json_in_realtime_events_and_raw_frames_keep_the_socket(server: LiveServer) -> None:
    problems: list[str] = []
    for frame in RAW_FRAMES:
        problems += _realtime_round(server, frame, f"raw {frame[:20]!r}")

    @FUZZ
    @given(variant=variants(REALTIME["session.update"]) | variants(REALTIME["response.create"])
           | variants(REALTIME["conversation.item.create"]))
    def check(variant: tuple[str, Json]) -> None:
        what, doc = variant
        problems.extend(_realtime_round(server, json.dumps(doc), what))

    check()
    assert problems == []


# ---- speech stream ------------------------------------------------------------------------------------

SPEECH_STREAMS: dict[str, list[Json]] = {
    "own": [{"type": "session.update", "voice": "Ethan", "instructions": "calm"},
            {"type": "input_text.delta", "delta": "Hi there. "}, {"type": "input_text.done"}],
    "vllm-omni": [{"type": "session.config", "voice": "Ethan", "response_format": "pcm", "speed": 1.0,
                   "language": "English", "instructions": "calm", "stream_audio": True,
                   "split_granularity": "sentence"},
                  {"type": "input.text", "text": "Hi there. "}, {"type": "input.done"}],
}


# Sent after the hostile frames: the session must still be reading and end on its done event. vLLM-Omni's first,
# then this server's own (a session.config mutated out of its type leaves the session speaking the own dialect,
# where input.done is one more error event; a session that ended on input.done never reads the second).
DONE_FRAMES = {"own": [json.dumps({"type": "input_text.done"})],
               "vllm-omni": [json.dumps({"type": "input.done"}), json.dumps({"type": "input_text.done"})]}
DONE_EVENTS = ("speech.audio.done", "session.done")


def _speech_round(server: LiveServer, frames: list[str | bytes], what: str, must_fail: bool = False,
                  dialect: str = "own") -> list[str]:
    """Plays ``frames`` then the dialect's done to a speech stream and reads to the close: problems with how it
    ended (with ``must_fail``, an end without an error)."""
    url = server.base_url.replace("http://", "ws://") + "/v1/audio/speech/stream"
    problems: list[str] = []
    with connect(url, open_timeout=TIMEOUT_S, close_timeout=1) as ws:
        errors, finished = 0, False
        with contextlib.suppress(ConnectionClosed):  # a session that ended on the frames' own done reads no more
            for frame in frames + DONE_FRAMES[dialect]:
                ws.send(frame)
        try:
            while True:
                message = ws.recv(TIMEOUT_S)
                event = json.loads(message) if isinstance(message, str) else {}
                finished |= event.get("type") in DONE_EVENTS
                if event.get("type") == "error":
                    errors += 1
                    if isinstance(event.get("error"), dict):  # vLLM-Omni's errors carry message and code flat
                        problems.append(error_problem(event, what) or "")
        except TimeoutError:
            return [f"{what}: neither done nor closed within {TIMEOUT_S} s"]
        except ConnectionClosed:
            pass
        if ws.close_code != 1000 or not finished:
            problems.append(f"{what}: closed with {ws.close_code} after {errors} error event(s), done: {finished}")
        elif must_fail and not errors:
            problems.append(f"{what}: taken without an error event")
    return [p for p in problems if p]


@pytest.mark.parametrize("dialect", list(SPEECH_STREAMS))
def test_every_field_of_every_speech_stream_event_with_every_wrong_type_is_an_error_and_the_session_goes_on(
        server: LiveServer, dialect: str) -> None:
    events = SPEECH_STREAMS[dialect]
    problems = _speech_round(server, [json.dumps(e) for e in events], f"{dialect} as given", dialect=dialect)
    for index, event in enumerate(events):
        for what, doc in mutations(event):
            frames = [json.dumps(e) for e in events]
            frames[index] = json.dumps(doc)
            # Tolerated: null ("unset"), a field this server ignores, and pydantic's reading of true as 1
            tolerated = " = null" in what or what.startswith(("split_granularity", "speed = bool"))
            problems += _speech_round(server, frames, f"{dialect} {event['type']} {what}", must_fail=not tolerated,
                                      dialect=dialect)
    assert problems == []


def test_raw_frames_on_a_speech_stream_are_error_events_and_the_session_goes_on(server: LiveServer) -> None:
    problems: list[str] = []
    for frame in RAW_FRAMES:
        problems += _speech_round(server, [frame], f"raw {frame[:20]!r}", must_fail=True)
    assert problems == []
