"""ZeroMQ PUSH/PULL pipes carrying typed messages, one pipe per direction per replica.

The orchestrator binds every socket; a replica connects. Addresses are
``ipc://`` files for replicas in processes, ``inproc://`` names (same zmq
context) for replicas in threads, and ``tcp://`` ports on the orchestrator's
host for replicas on other machines (Ray): those bind to any free port and the
bound ``address`` is what a replica is told. High-water marks are off: a pipe never drops
a message and a send never blocks on a slow reader. A socket is used by one
thread only (zmq sockets are not thread-safe).
"""

from __future__ import annotations

import itertools
import logging
import os
import shutil
import tempfile
from pathlib import Path

import msgspec
import zmq

from omnistage.ipc.serialization import MessageCodec, TensorStore

logger = logging.getLogger(__name__)
# As plain ints: the enum versions cost an IntFlag operation per test, on every drain of every reader.
_EVENTS, _POLLIN = int(zmq.EVENTS), int(zmq.POLLIN)
_NAMES = itertools.count()


class AddressBook:
    """Fresh addresses for one pipeline: a private folder of sockets, in-process names, or TCP ports on
    ``tcp_host`` (an address other machines reach this one at)."""

    def __init__(self, in_process: bool, tcp_host: str | None = None) -> None:
        self.in_process = in_process
        self.tcp_host = tcp_host
        # A unix socket path must fit in ~107 bytes: a long $TMPDIR falls back to /tmp.
        base = tempfile.gettempdir() if len(tempfile.gettempdir()) <= 60 else "/tmp"
        local = in_process or tcp_host is not None
        self.folder = None if local else Path(tempfile.mkdtemp(prefix="omnistage-zmq-", dir=base))
        self._tag = f"{os.getpid()}-{next(_NAMES)}"

    def new(self, name: str) -> str:
        """An address to bind (for TCP a wildcard port: read the bound one from the socket's ``address``)."""
        if self.tcp_host is not None:
            return f"tcp://{self.tcp_host}:*"
        if self.folder is None:
            return f"inproc://omnistage-{self._tag}-{name}"
        return f"ipc://{self.folder / name}"

    def cleanup(self) -> None:
        if self.folder is not None:
            shutil.rmtree(self.folder, ignore_errors=True)  # replicas may have removed parts already


def next_address(address: str, generation: int) -> str:
    """A fresh address to bind in place of ``address`` (a restarted replica's): nothing queued for the old
    peer reaches the new one, and a socket file the old one removed (or zmq unlinks late) does not matter."""
    if address.startswith("tcp://"):
        return f"{address.rsplit(':', 1)[0]}:*"
    return f"{address.split('~')[0]}~{generation}"


def _socket(ctx: zmq.Context, kind: int, address: str, bind: bool) -> zmq.Socket:
    sock = ctx.socket(kind)
    sock.setsockopt(zmq.SNDHWM, 0)
    sock.setsockopt(zmq.RCVHWM, 0)
    sock.setsockopt(zmq.LINGER, 0)
    if address.startswith("tcp://["):
        sock.setsockopt(zmq.IPV6, 1)  # an IPv6 node address (IPv4 ones stay plain, as a peer may lack IPv6)
    if bind:
        sock.bind(address)
    else:
        sock.connect(address)
    return sock


def _bound(sock: zmq.Socket) -> str:
    """The address a peer connects to: a wildcard TCP port resolved to the one the kernel gave."""
    return sock.getsockopt_string(zmq.LAST_ENDPOINT)


class Sender:
    def __init__(self, ctx: zmq.Context, address: str, message_type: object, store: TensorStore | None,
                 bind: bool) -> None:
        self.socket = _socket(ctx, zmq.PUSH, address, bind)
        self.address = _bound(self.socket) if bind else address
        self.codec = MessageCodec(message_type, store)
        self.bytes = 0  # message bytes sent so far (frames; a tensor in shared memory counts as its key)

    def send(self, message: msgspec.Struct, block: bool = True) -> None:
        """``block=False`` raises ``zmq.Again`` when no peer is connected (a PUSH would wait for one)."""
        frames = self.codec.encode(message)
        # copy=False: zmq sends the tensor buffers from their own memory.
        self.socket.send_multipart(frames, 0 if block else zmq.NOBLOCK, copy=False)
        self.bytes += sum(memoryview(f).nbytes for f in frames)

    def close(self, linger_ms: int = 0) -> None:
        """``linger_ms`` > 0 lets messages still queued go out first (a replica's last words)."""
        self.socket.close(linger=linger_ms)


class Receiver:
    def __init__(self, ctx: zmq.Context, address: str, message_type: object, store: TensorStore | None,
                 bind: bool) -> None:
        self.socket = _socket(ctx, zmq.PULL, address, bind)
        self.address = _bound(self.socket) if bind else address
        self.codec = MessageCodec(message_type, store)
        self.bytes = 0  # message bytes received so far

    def recv(self, timeout_ms: int | None = None) -> msgspec.Struct | None:
        """The next message, or None when none came within ``timeout_ms`` (None = wait)."""
        if timeout_ms is not None and not self.socket.poll(timeout_ms, zmq.POLLIN):
            return None
        return self._decode(self.socket.recv_multipart(copy=False))

    def drain(self) -> list[msgspec.Struct]:
        """Every message already waiting, without blocking (asked of the socket's events, not by raising
        ``zmq.Again`` at the end: an exception per drain cost more than a small message). A message that does not
        decode (a field past its checks) is logged and dropped: the reading thread goes on with the others."""
        out = []
        while self.socket.getsockopt(_EVENTS) & _POLLIN:
            frames = self.socket.recv_multipart(zmq.NOBLOCK, copy=False)
            try:
                out.append(self._decode(frames))
            except (msgspec.DecodeError, ValueError, TypeError) as exc:  # ValidationError is a DecodeError
                logger.error("dropped a message that does not decode: %s", exc)
        return out

    def _decode(self, frames: list[zmq.Frame]) -> msgspec.Struct:
        buffers = [f.buffer for f in frames]
        self.bytes += sum(b.nbytes for b in buffers)
        return self.codec.decode(buffers)

    def close(self) -> None:
        self.socket.close(linger=0)
