"""A two-node Ray cluster on one machine whose nodes talk over a real network link: the head in this process's
network namespace, the second node in a network namespace of its own, joined by a veth pair with private
addresses. Killing the second node's raylet is then a node lost as Ray sees it in production (its TCP
connections reset, its workers die with it, the GCS marks it dead), and bytes on the veth are exactly what
crosses between the two nodes.

Needs root and ``ip`` (iproute2); ``netns_ray_cluster`` skips the test otherwise. Every name it makes (the
namespace, the veth pair, the subnet, Ray's temp dir and ports) is private to this process, so helpers running
side by side do not collide, and ``close`` removes all of it, also when the test failed: every process in the
namespace is killed before it is deleted, and every process of the head is found by its temp dir.
"""

from __future__ import annotations

import os
import sys
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest

START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 15.0
STARTED = "Ray runtime started"


def _ip(*args: str, netns: str | None = None) -> None:
    command = ["ip", *args] if netns is None else ["ip", "netns", "exec", netns, "ip", *args]
    subprocess.run(command, check=True, capture_output=True, text=True)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("", 0))
        return probe.getsockname()[1]


def _free_subnet() -> str:
    """A 10.213.N.0/24 no interface of this namespace uses (the first three octets)."""
    used = subprocess.run(["ip", "-o", "-4", "addr"], check=True, capture_output=True, text=True).stdout
    for n in [(os.getpid() + i) % 250 + 1 for i in range(250)]:
        if f" 10.213.{n}." not in used:
            return f"10.213.{n}"
    raise RuntimeError("no free 10.213.N.0/24 subnet")


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def _children_of(pids: set[int]) -> set[int]:
    """``pids`` and all their descendants (by each process's parent id)."""
    parents: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            parents[int(stat.parent.name)] = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
    found = set(pids)
    while grown := {pid for pid, parent in parents.items() if parent in found and pid not in found}:
        found |= grown
    return found


def _kill(pids: set[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


@dataclass
class RayNode:
    """One ``ray start --block`` (it stays the parent of the node's processes and stops them when it ends)."""

    process: subprocess.Popen[str]
    lines: list[str] = field(default_factory=list)

    def wait_started(self, timeout_s: float) -> None:
        started = threading.Event()

        def read() -> None:
            assert self.process.stdout is not None
            for line in self.process.stdout:
                self.lines.append(line)
                if STARTED in line:
                    started.set()
            started.set()  # it exited: wake the waiter, which then reports its output

        threading.Thread(target=read, daemon=True).start()
        if not started.wait(timeout_s) or self.process.poll() is not None:
            raise RuntimeError("ray start failed:\n" + "".join(self.lines[-30:]))

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


@dataclass
class NetnsRayCluster:
    """The head at ``head_ip`` (this namespace), the second node at ``node_ip`` in ``netns``."""

    tag: str
    subnet: str
    temp_dir: Path
    port: int = field(default_factory=_free_port)
    env: dict[str, str] = field(default_factory=dict)
    head: RayNode | None = None
    node: RayNode | None = None
    spare: RayNode | None = None  # a third node, beside the head in this namespace (``start_spare``)
    netns_made: bool = False

    @property
    def netns(self) -> str:
        return f"omnistage-{self.tag}"

    @property
    def veth(self) -> str:
        return f"osh{self.tag}"[:15]  # the head's end; the namespace's end is "osn..."

    @property
    def head_ip(self) -> str:
        return f"{self.subnet}.1"

    @property
    def node_ip(self) -> str:
        return f"{self.subnet}.2"

    @property
    def address(self) -> str:
        return f"{self.head_ip}:{self.port}"

    def make_link(self) -> None:
        peer = f"osn{self.tag}"[:15]
        _ip("netns", "add", self.netns)
        self.netns_made = True
        _ip("link", "add", self.veth, "type", "veth", "peer", "name", peer)
        _ip("link", "set", peer, "netns", self.netns)
        _ip("addr", "add", f"{self.head_ip}/24", "dev", self.veth)
        _ip("link", "set", self.veth, "up")
        _ip("addr", "add", f"{self.node_ip}/24", "dev", peer, netns=self.netns)
        _ip("link", "set", peer, "up", netns=self.netns)
        _ip("link", "set", "lo", "up", netns=self.netns)

    def _ray_start(self, prefix: list[str], args: list[str], where: str) -> RayNode:
        ray = str(Path(sys.executable).with_name("ray"))
        command = [*prefix, ray, "start", "--block", "--disable-usage-stats", "--object-store-memory", "80000000",
                   "--temp-dir", str(self.temp_dir / where), *args]
        node = RayNode(subprocess.Popen(command, env={**os.environ, **self.env}, stdout=subprocess.PIPE,
                                        stderr=subprocess.STDOUT, text=True, start_new_session=True))
        node.wait_started(START_TIMEOUT_S)
        return node

    def start_head(self, *args: str) -> None:
        self.head = self._ray_start([], ["--head", "--node-ip-address", self.head_ip, "--port", str(self.port),
                                         "--ray-client-server-port", str(_free_port()),
                                         "--dashboard-agent-listen-port", str(_free_port()),
                                         "--include-dashboard=false", *args], "head")

    def start_node(self, *args: str) -> None:
        """Starts (or, after ``kill_node_raylet``, restarts) the second node in the namespace."""
        if self.node is not None:
            self.node.stop()
        self.node = self._ray_start(["ip", "netns", "exec", self.netns],
                                    ["--address", self.address, "--node-ip-address", self.node_ip, *args], "node")

    def start_spare(self, *args: str) -> None:
        """A third node joins, in this namespace beside the head (one machine may run several raylets)."""
        self.spare = self._ray_start([], ["--address", self.address, "--node-ip-address", self.head_ip, *args],
                                     "spare")

    def node_pids(self) -> set[int]:
        if not self.netns_made:
            return set()
        out = subprocess.run(["ip", "netns", "pids", self.netns], capture_output=True, text=True).stdout
        return {int(pid) for pid in out.split()}

    def kill_node_raylet(self) -> int:
        """SIGKILLs the second node's raylet (its workers and ``ray start`` follow it); returns its pid."""
        raylet = next(pid for pid in self.node_pids() if _comm(pid) == "raylet")
        os.kill(raylet, signal.SIGKILL)
        return raylet

    def set_link(self, up: bool) -> None:
        """Cuts (or restores) the link between the nodes: both go on running, unreachable to each other."""
        _ip("link", "set", self.veth, "up" if up else "down")

    def link_bytes(self) -> int:
        """Bytes both ways on the veth so far: everything between the two nodes."""
        stats = Path(f"/sys/class/net/{self.veth}/statistics")
        return int((stats / "rx_bytes").read_text()) + int((stats / "tx_bytes").read_text())

    def head_pids(self, where: str = "head") -> set[int]:
        """The processes of the head (or ``where="spare"``, the spare): whatever names its temp dir, and their
        children (Ray's renamed workers)."""
        marker = str(self.temp_dir / where)
        roots = {int(p.name) for p in Path("/proc").glob("[0-9]*") if marker in _cmdline(int(p.name))}
        node = self.head if where == "head" else self.spare
        if node is not None and node.process.poll() is None:
            roots.add(node.process.pid)
        return _children_of(roots)

    def close(self) -> None:
        for node in (self.node, self.spare, self.head):
            if node is not None:
                node.stop()
        _kill(self.node_pids() | _children_of(self.node_pids()))
        _kill(self.head_pids("spare") | self.head_pids())
        if self.netns_made:
            deadline = time.monotonic() + STOP_TIMEOUT_S
            while self.node_pids() and time.monotonic() < deadline:
                time.sleep(0.1)
            subprocess.run(["ip", "netns", "del", self.netns], capture_output=True)  # takes the veth pair along
            self.netns_made = False
        shutil.rmtree(self.temp_dir, ignore_errors=True)


def _can_make_namespaces() -> str:
    """Why this machine cannot run the cluster (empty when it can)."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which("ip") is None:
        return "network namespaces need iproute2's ip"
    return ""


@contextmanager
def netns_ray_cluster(env: dict[str, str] | None = None) -> Iterator[NetnsRayCluster]:
    """The link made and nothing started yet (``start_head``, ``start_node``); all of it removed on exit."""
    if why := _can_make_namespaces():
        pytest.skip(why)
    tag = f"{os.getpid() % 100000}{int(time.monotonic() * 1000) % 1000}"
    # Short: Ray puts unix sockets under the temp dir, and a socket path has a 107-byte limit.
    cluster = NetnsRayCluster(tag, _free_subnet(), Path(tempfile.mkdtemp(prefix="rayns", dir="/tmp")),
                              env={"RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0", **(env or {})})
    try:
        try:
            cluster.make_link()
        except subprocess.CalledProcessError as exc:
            pytest.skip(f"cannot make a network namespace here: {exc.stderr.strip()}")
        yield cluster
    finally:
        cluster.close()
