"""The settings a WebRTC call opens with: its ephemeral key's, and the form's ``session`` part on top.

The form's part is checked as ``session.update`` checks it (``client_secrets.check_settings``: a 400 naming the
first bad field) before the call is set up. Over an ephemeral key it may narrow what the key was minted with,
never widen it: a setting the key fixed may be given again unchanged, ``output_modalities`` cut to a subset, and
``max_output_tokens`` lowered; any other change of it is a 400 naming the field. Settings the key left out are the
form's to choose (the key's minter left them open).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from omnistage.entrypoints.openai.common.errors import APIError
from omnistage.entrypoints.openai.realtime.client_secrets import check_settings
from omnistage.entrypoints.openai.realtime.protocol import SessionConfig, session_fields, update_session
from omnistage.entrypoints.openai.realtime.session_loop import RealtimeService

Settings = dict[str, Any]  # a session object, as session.update and client_secrets take it
_CONTAINERS = frozenset({("audio",), ("audio", "input"), ("audio", "output")})  # merged field by field


def _tokens(value: int | None) -> float:
    return float("inf") if value is None else value


# How a setting the key fixed may change: to a value the key's allows, and nothing more.
_NARROWER: dict[str, Callable[[Any, Any], bool]] = {
    "output_modalities": lambda new, old: set(new) <= set(old),
    "max_output_tokens": lambda new, old: _tokens(new) <= _tokens(old),
}


def call_settings(service: RealtimeService, minted: Settings | None, form: Settings | None) -> Settings | None:
    """The session settings a call opens with (None: the server's defaults); an APIError for a bad field."""
    if form is None:
        return minted  # checked when the key was minted
    if minted is not None:
        _check_narrows(minted, form)
    merged = merge(minted or {}, form)
    check_settings(service, merged)
    return merged


def merge(base: Settings, top: Settings, path: tuple[str, ...] = ()) -> Settings:
    """``top``'s settings over ``base``'s, field by field (``audio.input`` and ``audio.output`` hold several)."""
    merged = dict(base)
    for key, value in top.items():
        inner = (*path, key)
        if inner in _CONTAINERS and isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = merge(merged[key], value, inner)
        else:
            merged[key] = value
    return merged


def _check_narrows(minted: Settings, form: Settings) -> None:
    fixed = {name for name, _, _ in session_fields(minted)}
    keyed, _ = update_session(SessionConfig(), {"type": "session.update", "session": minted})
    changed, errors = update_session(keyed, {"type": "session.update", "session": form})
    if errors:
        raise APIError(400, str(errors[0]), param=errors[0].param, code=errors[0].code)
    for name, param, _ in session_fields(form):
        old, new = getattr(keyed, name), getattr(changed, name)
        if name in fixed and old != new and not _NARROWER.get(name, lambda *_: False)(new, old):
            raise APIError(400, f"{param} is fixed by the ephemeral key: the session part may narrow the key's "
                                "settings, not change them", param=param, code="setting_fixed_by_key")
