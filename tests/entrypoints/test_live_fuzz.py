"""``WS /v1/live/sessions`` fuzzed: every field of every GPT-Live client event replaced by every other JSON type,
and raw frames that are not JSON objects. A Live session answers a bad event with an OpenAI-shaped ``error`` and
keeps reading: after each hostile frame a probe (a command this server refuses, echoing its ``event_id``) must be
answered on the same socket, before the session starts and after it."""

from __future__ import annotations

import base64
import json

import numpy as np
import pytest
from websockets.sync.client import connect

from tests.entrypoints.conftest import LiveServer
from tests.entrypoints.json_mutations import Json, mutations
from tests.entrypoints.test_fuzz_events import RAW_FRAMES, TIMEOUT_S, errors_to_probe

pytestmark = pytest.mark.e2e
PCM = base64.b64encode((np.sin(np.arange(2400) * 0.05) * 8000).astype("<i2").tobytes()).decode()
PROBE = {"type": "response.create", "event_id": "probe"}  # refused before and after the start, its id echoed
START: Json = {"type": "session.start", "event_id": "e", "session": {
    "model": "MODEL", "instructions": "be brief", "store": False, "safety_identifier": "u1",
    "audio": {"format": {"type": "audio/pcm", "rate": 24000}, "output": {"voice": "marin"}},
    "input": [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]}],
    "delegation": {"type": "client", "acknowledgement_delay_ms": 0}}}
STARTED: dict[str, Json] = {
    "session.input_audio.append": {"type": "session.input_audio.append", "event_id": "e", "audio": PCM},
    "session.input_audio.mute": {"type": "session.input_audio.mute", "event_id": "e"},
    "session.instructions.append": {"type": "session.instructions.append", "event_id": "e", "content": "x",
                                    "delegation_id": None},
    "session.commentary.append": {"type": "session.commentary.append", "event_id": "e", "content": "x",
                                  "delegation_id": None},
    "session.update": {"type": "session.update", "event_id": "e", "session": {"delegation": {"type": "client"}}},
    "session.close": {"type": "session.close", "event_id": "e"},
}


def _round(server: LiveServer, frame: str | bytes, what: str, started: bool, must_fail: bool) -> list[str]:
    with connect(server.base_url.replace("http://", "ws://") + "/v1/live/sessions", open_timeout=TIMEOUT_S,
                 close_timeout=1) as ws:
        if started:
            ws.send(json.dumps({"type": "session.start", "session": {"model": server.engine.model_name}}))
            assert json.loads(ws.recv(TIMEOUT_S))["type"] == "session.started"
        ws.send(frame)
        ws.send(json.dumps(PROBE))
        return errors_to_probe(ws, what, "client_event_id", must_fail)


def test_every_field_of_session_start_with_every_wrong_type_is_an_error(server: LiveServer) -> None:
    problems = []
    for what, doc in mutations(START, skip=frozenset({"session.model"})):
        text = json.dumps(doc).replace('"MODEL"', json.dumps(server.engine.model_name))
        # null is "unset" for an optional field; a start that is taken starts the session, then the probe is refused
        problems += _round(server, text, f"session.start {what}", False, must_fail=" = null" not in what)
    assert problems == []


@pytest.mark.parametrize("name", list(STARTED))
def test_every_field_of_every_live_event_with_every_wrong_type_is_an_error(server: LiveServer, name: str) -> None:
    problems = [] if name == "session.close" else _round(server, json.dumps(STARTED[name]), name, True, False)
    for what, doc in mutations(STARTED[name]):
        if name == "session.close" and " = null" in what:
            continue  # a close with no event_id is a close: the socket ends, as it should
        problems += _round(server, json.dumps(doc), f"{name} {what}", True,
                           must_fail=" = null" not in what or what.startswith("type"))
    assert problems == []


def test_raw_frames_are_errors_before_and_after_the_start(server: LiveServer) -> None:
    problems = []
    for frame in RAW_FRAMES:
        for started in (False, True):
            problems += _round(server, frame, f"raw {frame[:20]!r}", started, must_fail=True)
    assert problems == []
