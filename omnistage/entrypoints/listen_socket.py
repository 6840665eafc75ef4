"""The server's listening socket, bound first: a port in use (or not ours to take) is a one-line error within a
second of ``omnistage serve``, before any model loads. Not listening yet, so connections are refused, not left
hanging, until the server is ready."""

from __future__ import annotations

import errno
import socket

from omnistage.usage_error import UsageError


def bind_socket(host: str, port: int) -> socket.socket:
    """A socket bound to ``host:port`` (not yet listening: connections are refused until the server is up)."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise UsageError(f"--host {host!r} is not an address of this machine ({exc.strerror})") from None
    family, _, _, _, address = infos[0]
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn: a restart reuses TIME_WAIT ports
    try:
        sock.bind(address)
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise UsageError(f"port {port} on {host} is already in use: stop the other server or choose another "
                             f"with --port (make serve PORT=...)") from None
        if exc.errno in (errno.EACCES, errno.EPERM):
            raise UsageError(f"no permission to listen on port {port} (ports below 1024 need root): choose "
                             "another with --port") from None
        raise UsageError(f"cannot listen on {host}:{port}: {exc.strerror}") from None
    sock.set_inheritable(False)
    return sock
