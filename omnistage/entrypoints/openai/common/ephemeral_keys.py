"""Ephemeral keys: what a browser holds instead of the API key to open one realtime session.

An app's backend (or the playground, through the server) mints one with
``POST /v1/realtime/client_secrets``, which the real key guards. The key
(``ek_...``) carries the session settings it was minted with, opens
``/v1/realtime/calls`` or the realtime WebSocket only (the access middleware
claims it there; anywhere else it matches no key: a 401), expires (10 s to
2 h, OpenAI's range) and opens one session: a page that leaks it leaks at most
one session, never the means to mint more. A request holds the key while it
sets the session up (a second request with it is refused meanwhile) and spends
it only once the session is up: a request that fails first (a bad offer, a bad
setting, no place left) leaves the key usable. A call keeps the digest of the
key that opened it, so that key may hang the call up (and no other call).

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
_CLAIM = "omnistage.ephemeral_claim"  # where the middleware leaves a held key for the route
_OWNER = "omnistage.ephemeral_owner"  # where it leaves the digest of a key that may hang up the call it opened


@dataclass(frozen=True)
class EphemeralKey:
    value: str
    expires_at: int  # seconds since the epoch
    session: dict[str, Any]  # the client_secrets request's session object, applied when the session opens

    @property
    def owner(self) -> bytes:
        """What a call opened with this key remembers of it (the digest: the key itself is not kept)."""
        return _digest(self.value)


def _digest(value: str) -> bytes:
    # Stored by digest, as the API keys are: a dump of the store does not hand out live keys.
    return hashlib.sha256(value.encode("utf-8", "surrogatepass")).digest()


class EphemeralKeys:
    def __init__(self, capacity: int = DEFAULT_CAPACITY, clock: Callable[[], float] = time.time) -> None:
        self.capacity, self._clock = capacity, clock
        self._keys: OrderedDict[bytes, EphemeralKey] = OrderedDict()
        self._held: set[bytes] = set()  # digests of the keys a request is setting a session up with
        self._lock = threading.Lock()  # minted on the event loop, but tests and TestClient use other threads

    def mint(self, session: dict[str, Any], ttl_s: int = DEFAULT_TTL_S) -> EphemeralKey:
        if not MIN_TTL_S <= ttl_s <= MAX_TTL_S:
            raise ValueError(f"expires_after.seconds must be between {MIN_TTL_S} and {MAX_TTL_S}, got {ttl_s}")
        key = EphemeralKey(PREFIX + secrets.token_urlsafe(24), int(self._clock()) + ttl_s, session)
        with self._lock:
            self._drop_expired()
            while len(self._keys) >= self.capacity:
                self._held.discard(self._keys.popitem(last=False)[0])
            self._keys[_digest(key.value)] = key
        return key

    def hold(self, value: str) -> EphemeralKey | None:
        """The key, held for one request until it is spent or released; None when unknown, spent, expired or held
        by another request."""
        digest = _digest(value)
        with self._lock:
            key = self._keys.get(digest)
            if key is None or digest in self._held or key.expires_at <= self._clock():
                return None
            self._held.add(digest)
        return key

    def spend(self, key: EphemeralKey) -> None:
        with self._lock:
            self._keys.pop(key.owner, None)
            self._held.discard(key.owner)

    def release(self, key: EphemeralKey) -> None:
        """A held key its request did not spend: usable again."""
        with self._lock:
            self._held.discard(key.owner)

    def __len__(self) -> int:
        return len(self._keys)

    def _drop_expired(self) -> None:
        now = self._clock()
        for digest in [d for d, k in self._keys.items() if k.expires_at <= now]:
            del self._keys[digest]
            self._held.discard(digest)


def is_ephemeral(token: str) -> bool:
    return token.startswith(PREFIX)


@dataclass
class EphemeralClaim:
    """A key held by the request it came with: spent once the session it opens is set up, else released."""

    key: EphemeralKey
    store: EphemeralKeys
    spent: bool = False

    def spend(self) -> None:
        self.store.spend(self.key)
        self.spent = True

    def release(self) -> None:
        if not self.spent:
            self.store.release(self.key)


def remember_claim(scope: Scope, claim: EphemeralClaim) -> None:
    scope.setdefault("state", {})[_CLAIM] = claim


def ephemeral_claim(scope: Scope) -> EphemeralClaim | None:
    """The ephemeral key this request holds, if it came with one."""
    return scope.get("state", {}).get(_CLAIM)


def claimed_session(scope: Scope) -> dict[str, Any] | None:
    """The settings of the ephemeral key this connection was opened with, if any."""
    claim = ephemeral_claim(scope)
    return None if claim is None else claim.key.session


def remember_owner(scope: Scope, value: str) -> None:
    scope.setdefault("state", {})[_OWNER] = _digest(value)


def key_owner(scope: Scope) -> bytes | None:
    """The digest of the ephemeral key this request came with to hang up a call (None: it came with no such key),
    to compare with the call's ``EphemeralKey.owner``."""
    return scope.get("state", {}).get(_OWNER)
