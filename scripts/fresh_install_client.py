"""The client side of scripts/fresh_install_check.sh: what a newcomer tries first, against a running server.

    python scripts/fresh_install_client.py http://127.0.0.1:PORT MODEL

Three checks, each printed on its own line: a chat completion with text and audio, a realtime WebSocket
text turn read up to ``response.done``, and ``/docs`` with every asset it loads. Only the standard library
and ``websockets`` (a runtime dependency of omnistage), so it runs in the fresh virtualenv it checks.
Exits 1 at the first check that fails.
"""

from __future__ import annotations

import asyncio
import base64
import json
import re
import sys
import urllib.request
from collections.abc import Callable

from websockets.asyncio.client import connect

TIMEOUT_S = 120.0  # a CPU model's first request also warms it up


class CheckFailed(Exception):
    pass


def expect(condition: bool, message: str) -> None:
    if not condition:
        raise CheckFailed(message)


def http(url: str, body: dict | None = None) -> tuple[int, str, bytes]:
    """(status, content type, body) of a GET, or of a JSON POST when ``body`` is given."""
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"} if data else {})
    with urllib.request.urlopen(request, timeout=TIMEOUT_S) as response:
        return response.status, response.headers.get("content-type", ""), response.read()


def chat_with_audio(base_url: str, model: str) -> str:
    _, _, raw = http(f"{base_url}/v1/chat/completions",
                     {"model": model, "modalities": ["text", "audio"], "audio": {"format": "wav"},
                      "max_tokens": 8, "messages": [{"role": "user", "content": "Say hello."}]})
    message = json.loads(raw)["choices"][0]["message"]
    expect(message.get("audio") is not None, f"no audio in the reply: {message}")
    wav = base64.b64decode(message["audio"]["data"])
    expect(wav[:4] == b"RIFF" and len(wav) > 44, f"audio.data is not a WAV with samples ({len(wav)} bytes)")
    return f"{len(wav)} bytes of WAV, a transcript of {len(message['audio'].get('transcript', ''))} characters"


async def _realtime_turn(ws_url: str) -> str:
    async with connect(ws_url, open_timeout=30, max_size=None) as ws:
        async def until(kind: str) -> tuple[dict, list[dict]]:
            seen: list[dict] = []
            while True:
                event = json.loads(await asyncio.wait_for(ws.recv(), TIMEOUT_S))
                expect(event["type"] != "error", f"realtime error event: {event}")
                if event["type"] == kind:
                    return event, seen
                seen.append(event)

        async def send(event: dict) -> None:
            await ws.send(json.dumps(event))

        await until("session.created")
        await send({"type": "session.update", "session": {"type": "realtime", "instructions": "Be brief."}})
        await until("session.updated")
        await send({"type": "conversation.item.create",
                    "item": {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hi"}]}})
        await until("conversation.item.added")
        await send({"type": "response.create", "response": {"max_output_tokens": 8}})
        done, events = await until("response.done")
    status = done["response"]["status"]
    # A random tiny model rarely stops by itself: the token cap ending it is the path working.
    finished = status == "completed" or (status == "incomplete" and done["response"].get("status_details", {})
                                         .get("reason") == "max_output_tokens")
    expect(finished, f"response ended {status!r}: {done['response'].get('status_details')}")
    kinds = {e["type"] for e in events}
    expect("response.created" in kinds, f"no response.created before response.done: {sorted(kinds)}")
    audio = sum(len(base64.b64decode(e["delta"])) for e in events if e["type"] == "response.output_audio.delta")
    return f"{len(events)} events, {audio} bytes of audio, status {status}"


def realtime_turn(base_url: str, model: str) -> str:
    return asyncio.run(_realtime_turn(base_url.replace("http://", "ws://") + f"/v1/realtime?model={model}"))


def docs_page(base_url: str, _model: str) -> str:
    status, kind, raw = http(f"{base_url}/docs")
    page = raw.decode()
    expect(status == 200 and kind.startswith("text/html"), f"/docs answered {status} {kind}")
    expect(not re.search(r"https?://", page), "/docs refers to another host (it would be blank offline)")
    assets = re.findall(r"""(?:href|src)=["'](/[^"']+)["']""", page)
    expect(any(a.endswith(".js") for a in assets) and any(a.endswith(".css") for a in assets),
           f"/docs loads no script or stylesheet: {assets}")
    sizes = []
    for asset in assets:
        status, _, body = http(base_url + asset)
        expect(status == 200 and len(body) > 1000, f"{asset} answered {status} with {len(body)} bytes")
        sizes.append(f"{asset.rsplit('/', 1)[-1]} {len(body) // 1024} KiB")
    status, _, schema = http(f"{base_url}/openapi.json")
    expect("/v1/chat/completions" in json.loads(schema)["paths"], "/openapi.json lacks the chat route")
    return ", ".join(sizes)


CHECKS: tuple[tuple[str, Callable[[str, str], str]], ...] = (
    ("chat completion with audio", chat_with_audio), ("realtime WebSocket turn", realtime_turn),
    ("/docs and its assets", docs_page))


def main(base_url: str, model: str) -> int:
    for name, check in CHECKS:
        try:
            detail = check(base_url, model)
        except Exception as exc:  # noqa: BLE001 - any failure of a check is reported the same way
            print(f"  FAIL {name}: {type(exc).__name__}: {exc}", flush=True)
            return 1
        print(f"  ok   {name}: {detail}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1].rstrip("/"), sys.argv[2]))
