"""What an ephemeral key fixes for the Live session it opens.

A key minted by ``POST /v1/realtime/client_secrets`` carries a realtime session's settings, chosen by the app's
backend for a page it does not trust. A Live session opened with it takes the key's ``instructions`` and voice
where the key set them: a ``session.start`` (or WebRTC creation) that leaves them out gets the key's, one that
repeats them is fine, and one that changes them is refused (``setting_fixed_by_key``), as a realtime call's form
may narrow its key's settings but never change them.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from omnistage.entrypoints.openai.live.events import StartConfig
from omnistage.entrypoints.openai.realtime.event_error import EventError


def keyed(config: StartConfig, key_session: dict[str, Any] | None) -> StartConfig:
    """``config`` under the key's settings (the key minted with them, checked then)."""
    if not key_session:
        return config
    instructions = key_session.get("instructions")
    voice = ((key_session.get("audio") or {}).get("output") or {}).get("voice") or key_session.get("voice")
    if isinstance(voice, dict):
        voice = voice.get("id")
    if isinstance(instructions, str) and instructions:
        _check(config.instructions, instructions, "session.instructions")
        config = replace(config, instructions=instructions)
    if isinstance(voice, str) and voice:
        _check(config.voice, voice, "session.audio.output.voice")
        config = replace(config, voice=voice)
    return config


def _check(given: str | None, fixed: str, param: str) -> None:
    if given is not None and given != fixed:
        raise EventError("setting_fixed_by_key", f"{param} is fixed by the ephemeral key that opened this session: "
                         "leave it out or repeat it", param)
