"""Nodes on one machine: network namespaces joined to the host by veth pairs.

A multi-node job needs nodes that each have a network stack of their own: an address, a
loopback that is theirs alone, and a link to the store. `NodeNetwork` makes them with
``ip netns`` and ``ip link add ... type veth`` (root only, Linux only), so a test can run
``torchrun`` on two "nodes" of one machine::

    with NodeNetwork(2) as network:
        for node in network.nodes:
            subprocess.Popen(node.command(["python", "-c", "..."]), start_new_session=True)

Node ``i`` gets a ``/30`` of a ``/24`` picked at random, per run, inside the benchmarking range
198.18.0.0/15 (RFC 2544, never routed on the internet): the host side of its veth pair is
``.4i+1`` (services in the root namespace, such as the S3 proxy, listen there for that node) and
the node's own end, named ``eth0`` inside the namespace, is ``.4i+2``. Nodes reach one another
through the host: IPv4 forwarding is switched on for the host ends of these veth pairs only
(``net.ipv4.conf.<link>.forwarding``, gone with the link; the machine's ``ip_forward`` is left
alone), and a node has a route to the run's ``/24`` only, no default route, so nothing it sends
leaves the namespaces and host ends made here. Each namespace also gets an ``/etc/netns/NAME``
(``hosts`` mapping the machine's name to the node's address, ``resolv.conf`` with no reachable
DNS server), which ``ip netns exec`` mounts over ``/etc``, so name lookups fail at once instead
of timing out.

Names carry the process id and a random token, so runs never collide; `NodeNetwork.close`
kills every process in the namespaces and removes namespaces, links and those files, whatever
happened, and a new `NodeNetwork` first removes what a dead process (one killed before its
cleanup ran) left behind.
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from stoker.core.perprocess import pid_alive
from stoker.errors import StokerError

__all__ = [
    "BENCHMARK_NETWORK",
    "NetnsError",
    "Node",
    "NodeNetwork",
    "remove_orphans",
    "unavailable_reason",
]

logger = logging.getLogger(__name__)

#: RFC 2544's range for benchmarking networks: the only addresses the nodes get.
BENCHMARK_NETWORK = ipaddress.IPv4Network("198.18.0.0/15")
_PREFIX = "stoker"  # namespace names: stoker-<pid>-<token>-node<i>
_NAMESPACE = re.compile(rf"^{_PREFIX}-(\d+)-([0-9a-f]+)-node\d+$")
_MAX_NODES = 63  # /30s in a /24
_ETC = Path("/etc/netns")  # per-namespace /etc files that ``ip netns exec`` mounts


class NetnsError(StokerError):
    """A namespace, link or address could not be made or removed."""


def _ip() -> str:
    found = shutil.which("ip") or next(
        (p for p in ("/usr/sbin/ip", "/sbin/ip") if Path(p).is_file()), None
    )
    if found is None:
        raise NetnsError("the 'ip' command (iproute2) is not installed")
    return found


def _run(*args: str, check: bool = True) -> str:
    done = subprocess.run([_ip(), *args], capture_output=True, text=True, check=False)
    if check and done.returncode != 0:
        raise NetnsError(f"ip {' '.join(args)}: {done.stderr.strip() or done.returncode}")
    return done.stdout


def unavailable_reason() -> str | None:
    """Why namespaces cannot be made here (not Linux, not root, no iproute2), or None."""
    if not sys.platform.startswith("linux"):
        return f"network namespaces need Linux, this is {sys.platform}"
    if os.geteuid() != 0:
        return "network namespaces need root (ip netns add, ip link add ... type veth)"
    try:
        _ip()
    except NetnsError as exc:
        return str(exc)
    return None


@dataclass(frozen=True, slots=True)
class Node:
    """One node: a network namespace and its veth pair to the host.

    Attributes:
        namespace: Name of the network namespace (``ip netns exec NAME ...``).
        address: The node's address, on ``interface`` inside the namespace.
        host_address: The host end's address: where the root namespace serves this node.
        interface: Name of the node's end inside its namespace (``GLOO_SOCKET_IFNAME``).
        host_interface: Name of the host end in the root namespace.
    """

    namespace: str
    address: str
    host_address: str
    interface: str
    host_interface: str

    def command(self, argv: Sequence[str]) -> list[str]:
        """``argv`` run inside the node's namespace (``ip netns exec``)."""
        return [_ip(), "netns", "exec", self.namespace, *argv]

    def pids(self) -> list[int]:
        """Processes now in the node's namespace."""
        out = _run("netns", "pids", self.namespace, check=False)
        return [int(word) for word in out.split() if word.isdigit()]

    def kill(self, *, timeout_s: float = 10.0) -> list[int]:
        """SIGKILL every process in the namespace (the node "dies") and return their ids.

        Raises:
            NetnsError: Processes were still there after ``timeout_s``.
        """
        killed: list[int] = []
        deadline = time.monotonic() + timeout_s
        while pids := self.pids():
            if time.monotonic() > deadline:
                raise NetnsError(f"{self.namespace}: processes {pids} outlived SIGKILL")
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            killed += [p for p in pids if p not in killed]
            time.sleep(0.02)
        return killed


def _used_networks() -> list[ipaddress.IPv4Network]:
    out = _run("-4", "-o", "addr", "show") + _run("-4", "route", "show", "table", "all")
    found = []
    for word in re.findall(r"\b\d+\.\d+\.\d+\.\d+(?:/\d+)?\b", out):
        with contextlib.suppress(ValueError):
            found.append(ipaddress.IPv4Network(word, strict=False))
    return found


def _pick_subnet(rng: random.Random) -> ipaddress.IPv4Network:
    used = _used_networks()
    candidates = list(BENCHMARK_NETWORK.subnets(new_prefix=24))
    rng.shuffle(candidates)
    for subnet in candidates:
        if not any(subnet.overlaps(net) for net in used):
            return subnet
    raise NetnsError(f"every /24 of {BENCHMARK_NETWORK} is in use on this machine")


def _etc(namespace: str) -> Path:
    return _ETC / namespace


def _write_etc(node: Node) -> None:
    # ``ip netns exec`` mounts /etc/netns/NAME/* over /etc/*. Without this, name lookups in
    # a namespace wait out their timeouts on a DNS server it cannot reach (torch's c10d looks
    # up every peer's name): here the host name is the node's own address, and DNS goes to
    # the namespace's loopback, which refuses at once.
    etc = _etc(node.namespace)
    hostname = socket.gethostname()
    try:
        etc.mkdir(parents=True, exist_ok=True)
        (etc / "hosts").write_text(
            f"127.0.0.1 localhost\n::1 localhost\n{node.address} {hostname}\n", encoding="utf-8"
        )
        (etc / "resolv.conf").write_text(
            "# no DNS in a stoker.testing.netns node\nnameserver 127.0.0.1\n", encoding="utf-8"
        )
    except OSError as exc:
        raise NetnsError(f"cannot write {etc}: {exc}") from exc


def _remove_etc(namespace: str) -> None:
    shutil.rmtree(_etc(namespace), ignore_errors=True)
    with contextlib.suppress(OSError):  # not empty: other namespaces' files are there
        _ETC.rmdir()


def remove_orphans() -> list[str]:
    """Remove namespaces that a `NodeNetwork` of a process no longer running left behind.

    Returns:
        The namespaces removed.
    """
    removed = []
    for line in _run("netns", "list", check=False).splitlines():
        name = line.split(" ", 1)[0]
        match = _NAMESPACE.match(name)
        if match is None or pid_alive(int(match.group(1))):
            continue
        node = Node(name, "", "", "eth0", "")
        with contextlib.suppress(NetnsError):
            node.kill()
        _run("netns", "del", name, check=False)
        _remove_etc(name)
        removed.append(name)
    if removed:
        logger.warning("removed namespaces left by dead processes: %s", ", ".join(removed))
    return removed


class NodeNetwork:
    """``count`` nodes, each a network namespace with a veth pair to the root namespace.

    Use it as a context manager (or call `start` and, in a ``finally``, `close`).

    Args:
        count: How many nodes (1 to 63).
        seed: Seed of the random subnet and name token (None: fresh randomness).

    Raises:
        ValueError: ``count`` out of range.
    """

    def __init__(self, count: int = 2, *, seed: int | None = None) -> None:
        if not 1 <= count <= _MAX_NODES:
            raise ValueError(f"count must be 1 to {_MAX_NODES}, got {count}")
        self.count = count
        self._rng = random.Random(seed)
        self.nodes: list[Node] = []
        self.subnet: ipaddress.IPv4Network | None = None

    def start(self) -> list[Node]:
        """Make the namespaces, veth pairs, addresses and routes; return the nodes.

        Raises:
            NetnsError: With the failing command's error (not root, no veth support, ...);
                whatever was made before the failure is removed.
        """
        if self.nodes:
            raise RuntimeError("NodeNetwork is already started")
        reason = unavailable_reason()
        if reason is not None:
            raise NetnsError(reason)
        remove_orphans()
        self.subnet = _pick_subnet(self._rng)
        token = f"{self._rng.getrandbits(32):08x}"
        hosts = list(self.subnet)
        try:
            for i in range(self.count):
                node = Node(
                    namespace=f"{_PREFIX}-{os.getpid()}-{token}-node{i}",
                    address=str(hosts[4 * i + 2]),
                    host_address=str(hosts[4 * i + 1]),
                    interface="eth0",
                    host_interface=f"stk{token}h{i}",
                )
                self.nodes.append(node)
                self._make(node)
        except BaseException:
            self.close()
            raise
        logger.info(
            "nodes %s on %s",
            ", ".join(f"{n.namespace}={n.address}" for n in self.nodes),
            self.subnet,
        )
        return list(self.nodes)

    def _make(self, node: Node) -> None:
        ns, host = node.namespace, node.host_interface
        _run("netns", "add", ns)
        _write_etc(node)
        _run("link", "add", host, "type", "veth", "peer", "name", node.interface, "netns", ns)
        _run("addr", "add", f"{node.host_address}/30", "dev", host)
        Path(f"/proc/sys/net/ipv4/conf/{host}/forwarding").write_text("1\n")
        _run("link", "set", host, "up")
        _run("-n", ns, "addr", "add", f"{node.address}/30", "dev", node.interface)
        _run("-n", ns, "link", "set", node.interface, "up")
        _run("-n", ns, "link", "set", "lo", "up")
        _run("-n", ns, "route", "add", str(self.subnet), "via", node.host_address)

    def close(self) -> None:
        """Kill every process in the namespaces, then remove namespaces and links;
        idempotent.

        Raises:
            NetnsError: Something could not be removed (all the rest still is).
        """
        problems = []
        for node in self.nodes:
            try:
                node.kill()
            except NetnsError as exc:
                problems.append(str(exc))
            _run("netns", "del", node.namespace, check=False)
            _remove_etc(node.namespace)
            _run("link", "del", node.host_interface, check=False)  # gone with its peer, mostly
        left = {line.split(" ", 1)[0] for line in _run("netns", "list", check=False).splitlines()}
        problems += [
            f"namespace {n.namespace} is still there" for n in self.nodes if n.namespace in left
        ]
        self.nodes = []
        if problems:
            raise NetnsError("; ".join(problems))

    def __enter__(self) -> NodeNetwork:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
