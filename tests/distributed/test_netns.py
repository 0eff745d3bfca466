"""stoker.testing.netns: nodes with addresses of their own, joined through the host, and
nothing left behind."""

from __future__ import annotations

import ipaddress
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from stoker.testing.netns import (
    BENCHMARK_NETWORK,
    NetnsError,
    Node,
    NodeNetwork,
    remove_orphans,
    unavailable_reason,
)

IP = shutil.which("ip") or "/usr/sbin/ip"
CONNECT = """
import socket, sys
try:
    socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=3).close()
    print("connected")
except OSError as exc:
    print(type(exc).__name__)
"""


@pytest.fixture
def network() -> Iterator[NodeNetwork]:
    reason = unavailable_reason()
    if reason is not None:
        pytest.skip(f"cannot make network namespaces here: {reason}")
    made = NodeNetwork(2)
    try:
        made.start()
    except NetnsError as exc:
        pytest.skip(f"cannot make network namespaces here: {exc}")
    try:
        yield made
    finally:
        made.close()


def _connect(node: Node, host: str, port: int) -> str:
    done = subprocess.run(
        node.command([sys.executable, "-c", CONNECT, host, str(port)]),
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    return done.stdout.strip()


def _namespaces() -> set[str]:
    listed = subprocess.run([IP, "netns", "list"], capture_output=True, text=True, check=True)
    return {line.split(" ", 1)[0] for line in listed.stdout.splitlines()}


def _links() -> str:
    return subprocess.run([IP, "-o", "link"], capture_output=True, text=True, check=True).stdout


def test_nodes_reach_each_other_and_the_host_end_but_have_their_own_loopback(
    network: NodeNetwork,
) -> None:
    first, second = network.nodes
    for node in network.nodes:
        assert ipaddress.ip_address(node.address) in BENCHMARK_NETWORK
        assert ipaddress.ip_address(node.host_address) in BENCHMARK_NETWORK
    with socket.create_server((first.host_address, 0)) as on_host_end:
        assert _connect(first, first.host_address, on_host_end.getsockname()[1]) == "connected"
    with socket.create_server(("127.0.0.1", 0)) as on_loopback:
        # 127.0.0.1 in a node is the node's own loopback, where nothing listens.
        port = on_loopback.getsockname()[1]
        assert _connect(first, "127.0.0.1", port) == "ConnectionRefusedError"
    listener = subprocess.Popen(
        first.command(
            [
                sys.executable,
                "-c",
                "import socket, time; s = socket.create_server(('', 7070)); "
                "print('up', flush=True); time.sleep(60)",
            ]
        ),
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert listener.stdout is not None
        assert listener.stdout.readline().strip() == "up"
        assert _connect(second, first.address, 7070) == "connected"
    finally:
        listener.kill()
        listener.communicate()


def test_close_removes_namespaces_links_files_and_processes_after_a_failure() -> None:
    reason = unavailable_reason()
    if reason is not None:
        pytest.skip(f"cannot make network namespaces here: {reason}")
    network = NodeNetwork(2)
    started: list[subprocess.Popen[bytes]] = []

    def failing_test() -> None:
        with network:
            started.append(
                subprocess.Popen(
                    network.nodes[0].command([sys.executable, "-c", "import time; time.sleep(60)"]),
                    start_new_session=True,
                )
            )
            nodes.extend(network.nodes)
            assert _namespaces() >= {n.namespace for n in nodes}
            raise RuntimeError("the test failed")

    nodes: list[Node] = []
    with pytest.raises(RuntimeError, match="the test failed"):
        failing_test()
    (sleeper,) = started
    assert sleeper.wait(timeout=10) == -9
    assert not _namespaces() & {n.namespace for n in nodes}
    links = _links()
    assert not [n.host_interface for n in nodes if n.host_interface in links]
    assert not [n for n in nodes if Path("/etc/netns", n.namespace).exists()]
    assert network.nodes == []
    network.close()  # idempotent


def test_namespaces_of_a_dead_process_are_removed() -> None:
    reason = unavailable_reason()
    if reason is not None:
        pytest.skip(f"cannot make network namespaces here: {reason}")
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    orphan = f"stoker-{gone.pid}-0badf00d-node0"
    subprocess.run([IP, "netns", "add", orphan], check=True)
    try:
        assert orphan in remove_orphans()
        assert orphan not in _namespaces()
    finally:
        subprocess.run([IP, "netns", "del", orphan], capture_output=True, check=False)
