"""Who may talk to the server: API keys, WebSocket origins, and the Host a loopback server answers to.

One ASGI middleware, outermost, so nothing is read or parsed for a caller it
refuses. With ``--api-key`` every route needs ``Authorization: Bearer KEY``
except ``/health`` (and ``/metrics`` unless ``--protect-metrics``), as vLLM
does, and the pages that hold no secret (``/``, the docs, their schema and
assets: see ``landing.py``); a WebSocket may carry the key in that header
or, as OpenAI's browser SDKs send it, as the subprotocol
``openai-insecure-api-key.KEY``. An ephemeral key (``ek_...``, see
``ephemeral_keys.py``) opens only the realtime routes named for it, once:
the key is held in the connection's scope for the route, which spends it once
its session is set up (a WebSocket's once its model is checked); a request
that ends without spending it releases it. Under the prefix named for it, the key is
passed on to the route as the owner it claims to be (a call's hang-up: the
route compares it with the key that opened the call). An API key's digest is left in the scope too
(``caller``: whose request it is). Refusals are
401s in OpenAI's error shape; a WebSocket is refused before its handshake
completes (an HTTP response, where the server supports ASGI's denial
response). Keys are compared through their SHA-256 digests in constant time.

A WebSocket whose ``Origin`` is neither the server's own nor listed in
``--allowed-origins`` is refused (a web page the user opens must not drive a
local voice session), and a server bound to loopback answers only to a
loopback ``Host`` (a rebound DNS name is not loopback).
"""

from __future__ import annotations

import hashlib
import hmac
from urllib.parse import urlsplit

from starlette.datastructures import Headers
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from omnistage.entrypoints.openai.common.ephemeral_keys import (
    EphemeralClaim,
    EphemeralKeys,
    ephemeral_claim,
    is_ephemeral,
    remember_claim,
    remember_owner,
)
from omnistage.entrypoints.openai.common.errors import APIError
from omnistage.entrypoints.openai.server_config import AccessPolicy

KEY_SUBPROTOCOL = "openai-insecure-api-key."


CALLER = "omnistage.caller"  # the scope state's key for who the caller is


def caller(scope: Scope) -> str:
    """Who made this request: its API key's SHA-256 digest (hex), or "" on a server without keys (and on the
    routes open to all). What a caller keeps (stored responses) is theirs alone."""
    return scope.get("state", {}).get(CALLER, "")


def _digest(value: str) -> bytes:
    return hashlib.sha256(value.encode("utf-8", "surrogatepass")).digest()


def bearer_token(headers: Headers) -> str | None:
    scheme, _, token = headers.get("authorization", "").partition(" ")
    return token.strip() if scheme.lower() == "bearer" and token.strip() else None


def subprotocol_key(scope: Scope) -> str | None:
    for protocol in scope.get("subprotocols", ()):
        if protocol.startswith(KEY_SUBPROTOCOL):
            return protocol[len(KEY_SUBPROTOCOL):]
    return None


def host_name(value: str) -> str:
    """``Host``/``Origin`` netloc → lower-case host without port or IPv6 brackets."""
    try:
        return (urlsplit(f"//{value}").hostname or "").lower()
    except ValueError:
        return ""


class AccessMiddleware:
    def __init__(self, app: ASGIApp, policy: AccessPolicy, public_paths: frozenset[str],
                 public_prefix: str | tuple[str, ...],
                 ephemeral_keys: EphemeralKeys | None = None,
                 ephemeral_routes: frozenset[tuple[str, str]] = frozenset(),
                 ephemeral_owned_prefix: str | tuple[str, ...] | None = None) -> None:
        """``public_paths``, ``public_prefix``: the pages that hold no secret, named by whoever serves them
        (``landing.py``), so this guard knows no route. ``ephemeral_routes``: the ``(scope type, path)`` pairs an
        ephemeral key from ``ephemeral_keys`` opens (named by the realtime routes); ``ephemeral_owned_prefix``:
        the paths where it names what it opened (a call's hang-up), for the route to check."""
        self.app = app
        self.policy = policy
        self._ephemeral, self._ephemeral_routes = ephemeral_keys, ephemeral_routes
        self._ephemeral_owned = ephemeral_owned_prefix
        self._open_paths = frozenset({"/health", "/ready", *public_paths})  # probes carry no key
        self._public_prefix = public_prefix
        self._keys = tuple(_digest(k) for k in policy.api_keys)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        refusal = self.refusal(scope)
        if refusal is None:
            try:
                await self.app(scope, receive, send)
            finally:
                claim = ephemeral_claim(scope)
                if claim is not None:
                    claim.release()  # not spent: its request failed before its session was set up
        elif scope["type"] == "http":
            await refusal.response()(scope, receive, send)
        else:
            await self._deny_websocket(scope, send, refusal)

    def refusal(self, scope: Scope) -> APIError | None:
        """Why this connection may not go on, or None."""
        headers = Headers(scope=scope)
        if not self._host_allowed(headers.get("host", "")):
            return APIError(400, "this server does not answer to that Host header", code="invalid_host")
        if scope["type"] == "websocket" and not self._origin_allowed(headers):
            return APIError(403, "WebSocket connections from this Origin are not allowed (see --allowed-origins)",
                            code="origin_not_allowed")
        given = bearer_token(headers)
        if given is None and scope["type"] == "websocket":
            given = subprotocol_key(scope)
        if given is not None and is_ephemeral(given) and self._takes_ephemeral(scope):
            return self._claim(scope, given)  # elsewhere an ephemeral key matches no API key below
        if given is not None and is_ephemeral(given) and self._owned_by_ephemeral(scope):
            remember_owner(scope, given)  # the route lets it end only the call it opened
            return None
        if not self._keys or self._open(scope["path"]):
            return None
        if given is None:
            return Unauthorized("You didn't provide an API key: send it as 'Authorization: Bearer KEY'")
        if not self._key_matches(given):
            return Unauthorized("Incorrect API key provided")
        scope.setdefault("state", {})[CALLER] = _digest(given).hex()
        return None

    def _takes_ephemeral(self, scope: Scope) -> bool:
        return self._ephemeral is not None and (scope["type"], scope["path"]) in self._ephemeral_routes \
            and scope.get("method", "POST") == "POST"  # a WebSocket has no method; the calls route is POST only

    def _owned_by_ephemeral(self, scope: Scope) -> bool:
        return self._ephemeral_owned is not None and scope["type"] == "http" \
            and scope["path"].startswith(self._ephemeral_owned) and scope.get("method") in ("DELETE", "POST")

    def _claim(self, scope: Scope, given: str) -> APIError | None:
        key = self._ephemeral.hold(given) if self._ephemeral is not None else None
        if key is None:
            return Unauthorized("Incorrect, expired or already used ephemeral key")
        claim = EphemeralClaim(key, self._ephemeral)
        remember_claim(scope, claim)
        return None

    def _open(self, path: str) -> bool:
        return (path in self._open_paths or path.startswith(self._public_prefix)
                or (path == "/metrics" and not self.policy.protect_metrics))

    def _key_matches(self, given: str) -> bool:
        digest = _digest(given)
        matched = False
        for key in self._keys:  # every key is compared, so the time does not say which one matched
            matched |= hmac.compare_digest(digest, key)
        return matched

    def _host_allowed(self, host: str) -> bool:
        allowed = self.policy.allowed_hosts
        return allowed is None or host_name(host) in allowed

    def _origin_allowed(self, headers: Headers) -> bool:
        origin = headers.get("origin")
        if origin is None:  # not a browser: nothing to hijack
            return True
        allowed = self.policy.allowed_origins
        if "*" in allowed or origin.rstrip("/").lower() in allowed:
            return True
        parts = urlsplit(origin)
        # Same origin: the page was served by this server (the port included, the scheme ws/http alike).
        return parts.scheme in ("http", "https") and parts.netloc.lower() == headers.get("host", "").lower()

    @staticmethod
    async def _deny_websocket(scope: Scope, send: Send, refusal: APIError) -> None:
        if "websocket.http.response" not in scope.get("extensions", {}):
            await send({"type": "websocket.close", "code": 1008, "reason": refusal.detail.message[:120]})
            return
        response = refusal.response()
        await send({"type": "websocket.http.response.start", "status": response.status_code,
                    "headers": response.raw_headers})
        await send({"type": "websocket.http.response.body", "body": bytes(response.body)})


class Unauthorized(APIError):
    """A 401 with ``WWW-Authenticate: Bearer``, as RFC 6750 asks."""

    def __init__(self, message: str) -> None:
        super().__init__(401, message, code="invalid_api_key")

    def response(self) -> JSONResponse:
        response = super().response()
        response.headers["WWW-Authenticate"] = "Bearer"
        return response
