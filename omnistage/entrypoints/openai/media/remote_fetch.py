"""Fetching http(s) media URLs without becoming a proxy into the server's own network (SSRF).

Each hop's host is resolved once, and every address it resolves to must be a
public one: loopback, private, shared, link-local, multicast, reserved and
unspecified addresses are refused (IPv4-mapped and 6to4/NAT64-embedded IPv4
judged as the IPv4 they carry). The system resolver also reads the numeric
spellings of IPv4 (``2130706433``, ``0x7f.1``, ``0177.0.0.1``, ``127.1``), so
those are judged as the address they mean. Hosts listed in
``--allowed-media-domains`` skip the address check. The connection then goes to
the checked address itself, the URL's host kept for ``Host`` and TLS (SNI and
certificate), so a second lookup cannot be steered elsewhere (DNS rebinding).
Redirects are followed by hand, each target checked the same way, at most
``MAX_REDIRECTS``; ``--remote-media-timeout`` bounds the whole fetch, not each
read. Every failure answers the client with the same message, so errors tell
nothing about the server's network (which ports are open, which names resolve);
the reason goes to the server's log.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import socket
from dataclasses import dataclass
from urllib.parse import urljoin, urlsplit, urlunsplit

import httpx

from omnistage.entrypoints.openai.common.addresses import IPAddress, is_public
from omnistage.entrypoints.openai.common.errors import MediaError
from omnistage.entrypoints.openai.server_config import MediaPolicy

logger = logging.getLogger(__name__)
MAX_REDIRECTS = 5
FETCH_FAILED = "could not fetch the media URL"
_REDIRECTS = frozenset({301, 302, 303, 307, 308})


class _Refused(Exception):
    """Why one fetch failed (logged; the client gets FETCH_FAILED)."""


@dataclass(frozen=True)
class _Target:
    url: str  # the URL with the checked address in place of the host name
    host_header: str
    sni: str | None


class RemoteFetcher:
    def __init__(self, policy: MediaPolicy, max_bytes: int) -> None:
        self.policy = policy
        self.max_bytes = max_bytes

    async def fetch(self, url: str) -> bytes:
        try:
            async with asyncio.timeout(self.policy.remote_timeout_s):
                return await self._follow(url)
        except MediaError:
            raise
        except (_Refused, httpx.HTTPError, httpx.InvalidURL, httpx.StreamError, OSError, ValueError,
                UnicodeError) as exc:
            # TimeoutError is an OSError: the deadline is one of these reasons too.
            logger.info("remote media fetch refused or failed: %s", exc or type(exc).__name__)
            raise MediaError(FETCH_FAILED, code="fetch_failed") from None

    async def _follow(self, url: str) -> bytes:
        async with httpx.AsyncClient(follow_redirects=False, trust_env=False, timeout=None) as client:
            for _ in range(MAX_REDIRECTS + 1):
                target = await self._target(url)
                request = client.build_request("GET", target.url, headers={"Host": target.host_header},
                                               extensions={"sni_hostname": target.sni} if target.sni else {})
                response = await client.send(request, stream=True)
                try:
                    if response.status_code in _REDIRECTS and "location" in response.headers:
                        url = urljoin(url, response.headers["location"])
                        continue
                    if response.status_code != 200:
                        raise _Refused(f"{url}: HTTP {response.status_code}")
                    return await self._body(response)
                finally:
                    await response.aclose()
        raise _Refused(f"more than {MAX_REDIRECTS} redirects")

    async def _body(self, response: httpx.Response) -> bytes:
        body = bytearray()
        async for chunk in response.aiter_bytes():
            body += chunk
            if len(body) > self.max_bytes:  # stop reading: the size header may lie or be absent
                raise MediaError(f"the media at the URL is larger than {self.max_bytes} bytes",
                                 code="media_too_large")
        return bytes(body)

    async def _target(self, url: str) -> _Target:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise _Refused(f"not an http(s) URL with a host: {url!r}")
        if parts.username is not None or parts.password is not None:
            raise _Refused("credentials in the URL")
        host = parts.hostname.rstrip(".").lower()
        port = parts.port or (443 if parts.scheme == "https" else 80)
        address = await self._address(host, port)
        literal = f"[{address}]" if address.version == 6 else str(address)
        netloc = f"{literal}:{port}"
        checked = urlunsplit((parts.scheme, netloc, parts.path or "/", parts.query, ""))
        host_header = parts.netloc.rpartition("@")[2]
        return _Target(checked, host_header, host if parts.scheme == "https" else None)

    async def _address(self, host: str, port: int) -> IPAddress:
        """The one address to connect to: every address the host resolves to is checked."""
        try:
            infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except socket.gaierror as exc:
            raise _Refused(f"{host}: does not resolve ({exc})") from None
        # IPv4 first: a name like localhost resolves to both, and services often listen on IPv4 only.
        addresses = sorted({ipaddress.ip_address(info[4][0].split("%", 1)[0]) for info in infos},
                           key=lambda a: (a.version, int(a)))
        if not addresses:
            raise _Refused(f"{host}: no address")
        if host not in self.policy.allowed_media_domains:
            refused = [str(a) for a in addresses if not is_public(a)]
            if refused:
                raise _Refused(f"{host} resolves to non-public address(es) {', '.join(refused)} "
                               f"(allow the host with --allowed-media-domains)")
        return addresses[0]
