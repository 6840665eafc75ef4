"""Ephemeral keys: what a browser holds instead of the API key to open one realtime session.

An app's backend (or the playground, through the server) mints one with
``POST /v1/realtime/client_secrets``, which the real key guards. The key
(``ek_...``) carries the session settings it was minted with, opens
``/v1/realtime/calls`` or the realtime WebSocket only (the access middleware
claims it there; anywhere else it matches no key: a 401), expires (10 s to
2 h, OpenAI's range) and is claimed once: a page that leaks it leaks at most
one session, never the means to mint more.

The store is in memory and bounded: past ``capacity`` live keys, the oldest
goes (only holders of the real key can mint, so no stranger can flush it).
"""

from __future__ import annotations

import hashlib
import secrets
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from starlette.types import Scope

PREFIX = "ek_"
DEFAULT_TTL_S, MIN_TTL_S, MAX_TTL_S = 600, 10, 7200  # OpenAI's default and range for expires_after.seconds
DEFAULT_CAPACITY = 1024
_SCOPE_KEY = "omnistage.ephemeral_session"  # where the middleware leaves a claimed key's settings for the route


@dataclass(frozen=True)
class EphemeralKey:
    value: str
    expires_at: int  # seconds since the epoch
    session: dict[str, Any]  # the client_secrets request's session object, applied when the session opens


def _digest(value: str) -> bytes:
    # Stored by digest, as the API keys are: a dump of the store does not hand out live keys.
    return hashlib.sha256(value.encode("utf-8", "surrogatepass")).digest()


class EphemeralKeys:
    def __init__(self, capacity: int = DEFAULT_CAPACITY, clock: Callable[[], float] = time.time) -> None:
        self.capacity, self._clock = capacity, clock
        self._keys: OrderedDict[bytes, EphemeralKey] = OrderedDict()
        self._lock = threading.Lock()  # minted on the event loop, but tests and TestClient use other threads

    def mint(self, session: dict[str, Any], ttl_s: int = DEFAULT_TTL_S) -> EphemeralKey:
        if not MIN_TTL_S <= ttl_s <= MAX_TTL_S:
            raise ValueError(f"expires_after.seconds must be between {MIN_TTL_S} and {MAX_TTL_S}, got {ttl_s}")
        key = EphemeralKey(PREFIX + secrets.token_urlsafe(24), int(self._clock()) + ttl_s, session)
        with self._lock:
            self._drop_expired()
            while len(self._keys) >= self.capacity:
                self._keys.popitem(last=False)
            self._keys[_digest(key.value)] = key
        return key

    def claim(self, value: str) -> EphemeralKey | None:
        """The key's settings, once: it is gone afterwards. None when unknown, spent or expired."""
        with self._lock:
            key = self._keys.pop(_digest(value), None)
        if key is None or key.expires_at <= self._clock():
            return None
        return key

    def __len__(self) -> int:
        return len(self._keys)

    def _drop_expired(self) -> None:
        now = self._clock()
        for digest in [d for d, k in self._keys.items() if k.expires_at <= now]:
            del self._keys[digest]


def is_ephemeral(token: str) -> bool:
    return token.startswith(PREFIX)


def remember_claim(scope: Scope, key: EphemeralKey) -> None:
    scope.setdefault("state", {})[_SCOPE_KEY] = key.session


def claimed_session(scope: Scope) -> dict[str, Any] | None:
    """The settings of the ephemeral key this connection was opened with, if any."""
    return scope.get("state", {}).get(_SCOPE_KEY)
