"""Two nodes for real on one machine: network namespaces, torchrun's c10d rendezvous, a node
killed mid-epoch and the job going on with the one left (docs/nodes.md does it by hand).

Each node is a network namespace with a veth pair to the root namespace and an address of its
own (198.18.0.0/15), runs ``torchrun --nnodes 1:2 --nproc-per-node 2`` with its own disk cache,
and reads the packed dataset from the session's SeaweedFS server through a delaying proxy that
listens on its veth pair's host end. The first rendezvous round closes as soon as both nodes
have joined (the most ``1:2`` allows), so epoch 0 runs on 4 ranks (checked); in epoch 1, after
the checkpoint at step 4, node 1 is killed (SIGKILL to every process in its namespace), torchrun
on node 0 restarts its workers at a new round of one node, and they resume from the checkpoint
on a world of 2.

57-85 s on the 2-core development machine at a load average of 9-18 from other test runs
(about 35 CPU-s, most of it 8 Python processes importing torch).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from stoker.format.reader import open_dataset
from stoker.pack.packer import PackConfig, pack
from stoker.testing.images import write_image_folder
from stoker.testing.netns import NetnsError, Node, NodeNetwork, unavailable_reason
from stoker.testing.netproxy import LinkConfig, NetProxy

pytestmark = pytest.mark.slow

SCRIPT = Path(__file__).with_name("node_train.py")
SAMPLES = 320  # 10 steps of 8 per rank on 4 ranks, 20 on 2
STEPS_BEFORE_KILL = 4  # the checkpoint node 1 dies after, in epoch 1
PAGE_BYTES = 4096  # the disk caches' pages: small, so rounding reads out to pages costs little
GROUP_SAMPLES = 8  # samples per read group (one block): what a cut between ranks may cost
AGENT_UP = "Starting elastic_operator"  # what torchrun's agent logs once it has started
RENDEZVOUS_PORT = 29400  # in node 0's own network namespace: free whatever the host runs


@pytest.fixture
def nodes() -> Iterator[list[Node]]:
    """Two namespaces with a veth pair each; removed, with every process in them, at the end."""
    reason = unavailable_reason()
    if reason is not None:
        pytest.skip(f"cannot make network namespaces here: {reason}")
    network = NodeNetwork(2)
    try:
        network.start()
    except NetnsError as exc:
        pytest.skip(f"cannot make network namespaces here: {exc}")
    try:
        yield network.nodes
    finally:
        network.close()


@pytest.fixture
def dataset(s3_bucket: Any, tmp_path: Path) -> tuple[str, int, int]:
    """A packed dataset of SAMPLES JPEGs in the bucket: its URL, the bytes of its shards and
    the bytes of its index."""
    write_image_folder(tmp_path / "images", files=SAMPLES, classes=6, width=96, height=80)
    url = f"{s3_bucket.url}/ds"
    pack(
        tmp_path / "images",
        url,
        config=PackConfig(samples_per_shard=80),
        storage_options=s3_bucket.options(),
    )
    listed = s3_bucket.store("ds").list()
    shard_bytes = sum(meta.size for meta in listed if meta.key.endswith(".tar"))
    index_bytes = sum(meta.size for meta in listed if not meta.key.endswith(".tar"))
    assert shard_bytes > 0
    return url, shard_bytes, index_bytes


def _torchrun(
    node: Node, index: int, *, rendezvous: str, args: list[str], log: Path
) -> subprocess.Popen[bytes]:
    """torchrun on ``node``; node 0 hosts the rendezvous store at ``rendezvous``."""
    host = "1" if index == 0 else "0"
    command = [
        "env",
        f"STOKER_NODE=node{index}",
        f"GLOO_SOCKET_IFNAME={node.interface}",
        "OMP_NUM_THREADS=1",
        "LOGLEVEL=INFO",  # the agent logs AGENT_UP, and its rendezvous rounds
        # A new store for each attempt: torch 2.13 reuses the agent's shared one after a
        # restart, where the killed attempt's keys send gloo to addresses no longer open.
        "TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1",
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nnodes=1:2",
        "--nproc-per-node=2",
        "--max-restarts=1",
        "--monitor-interval=0.2",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint={rendezvous}",
        "--rdzv-id=stoker-nodes",
        # A dead node leaves the rendezvous after 3 missed 1 s heartbeats (not 3 x 5 s), and
        # a round with the minimum of nodes closes 3 s after it is reached (not 30 s).
        f"--rdzv-conf=is_host={host},last_call_timeout=3,join_timeout=60,"
        "keep_alive_interval=1,keep_alive_max_attempt=3",
        f"--local-addr={node.address}",
        str(SCRIPT),
        *args,
    ]
    with open(log, "wb") as out:
        return subprocess.Popen(
            node.command(command), stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )


def _wait(
    condition: Callable[[], bool],
    what: str,
    processes: dict[str, subprocess.Popen[bytes]],
    logs: Path,
    timeout_s: float,
) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        for name, process in processes.items():
            if process.poll() is not None:
                pytest.fail(f"{name} exited {process.returncode} before {what}:\n{_tails(logs)}")
        if time.monotonic() > deadline:
            pytest.fail(f"no {what} within {timeout_s:.0f} s:\n{_tails(logs)}")
        time.sleep(0.05)


def _tails(logs: Path) -> str:
    return "\n".join(
        f"--- {log.name}\n" + "\n".join(log.read_text(errors="replace").splitlines()[-25:])
        for log in sorted(logs.glob("*.log"))
    )


def _records(out: Path, restart: int) -> list[dict[str, Any]]:
    found = [json.loads(p.read_text()) for p in sorted(out.glob(f"rank*-restart{restart}.json"))]
    return sorted(found, key=lambda record: record["rank"])


def test_two_nodes_exactly_once_per_node_bytes_and_elastic_restart(
    nodes: list[Node], dataset: tuple[str, int, int], s3_bucket: Any, tmp_path: Path
) -> None:
    url, shard_bytes, index_bytes = dataset
    out, logs = tmp_path / "out", tmp_path / "logs"
    out.mkdir()
    logs.mkdir()
    link = LinkConfig(rtt_s=0.004)
    proxies = [
        NetProxy("127.0.0.1", s3_bucket.server.port, link=link, listen_host=node.host_address)
        for node in nodes
    ]
    processes: dict[str, subprocess.Popen[bytes]] = {}
    started = time.monotonic()
    try:
        for proxy in proxies:
            proxy.start()
        # Node 1 first, and node 0 once node 1's agent is up and waiting to reach the
        # rendezvous store that node 0 hosts: both then join the first round before node 0's
        # last call (3 s) could close it with node 0 alone.
        for index in (1, 0):
            node, proxy = nodes[index], proxies[index]
            args = [
                url,
                str(out),
                f"--storage-options={json.dumps(s3_bucket.options(proxy.endpoint))}",
                f"--cache-dir={tmp_path / f'cache-node{index}'}",
                f"--pause-at={STEPS_BEFORE_KILL}",
                f"--page-bytes={PAGE_BYTES}",
                f"--group-samples={GROUP_SAMPLES}",
            ]
            log = logs / f"node{index}.log"
            processes[f"node{index}"] = _torchrun(
                node, index, rendezvous=f"{nodes[0].address}:{RENDEZVOUS_PORT}", args=args, log=log
            )
            if index == 1:
                _wait(
                    lambda: AGENT_UP in (logs / "node1.log").read_text(errors="replace"),
                    "node 1's torchrun agent",
                    processes,
                    logs,
                    60,
                )
        _wait(
            lambda: len(list(out.glob("paused.rank*"))) == 4,
            "pause in epoch 1",
            processes,
            logs,
            60,
        )
        print(f"paused after {time.monotonic() - started:.1f} s")
        killed = nodes[1].kill()
        assert killed
        processes.pop("node1").wait(timeout=10)
        (out / "release").touch()
        survivor = processes["node0"]
        try:
            survivor.wait(timeout=60)
        except subprocess.TimeoutExpired:
            pytest.fail(f"node 0 did not finish within 60 s of the kill:\n{_tails(logs)}")
        print(f"done after {time.monotonic() - started:.1f} s")
        assert survivor.returncode == 0, _tails(logs)
    finally:
        for process in processes.values():
            process.kill()
            process.wait(timeout=10)
        for proxy in proxies:
            proxy.stop()

    first = _records(out, 0)
    second = _records(out, 1)
    zero = min(r["times"]["main"] for r in first)
    for r in first + second:
        print(
            r["node"],
            r["rank"],
            r["restart"],
            {k: round(v - zero, 1) for k, v in r["times"].items()},
        )
    assert [r["rank"] for r in first] == [0, 1, 2, 3]
    assert {r["world_size"] for r in first} == {4}
    assert sorted(r["node"] for r in first) == ["node0", "node0", "node1", "node1"]

    # Epoch 0 on 4 ranks: every sample exactly once, equal steps everywhere.
    epoch0 = [r["epochs"]["0"] for r in first]
    assert all(log["complete"] for log in epoch0)
    assert len({len(log["steps"]) for log in epoch0}) == 1
    keys = Counter(k for log in epoch0 for step in log["steps"] for k in step)
    assert len(keys) == SAMPLES
    assert set(keys.values()) == {1}

    # Each node's store bytes in epoch 0: the bytes of the samples it delivered, plus at most
    # what its ranks' cuts cost (a rank reads the whole read group that straddles each end of
    # its piece), the rounding of each GET out to whole disk-cache pages, and the index that
    # each rank reads once.
    index = open_dataset(url, storage_options=s3_bucket.options()).index
    length = dict(zip(index.keys, index.length.tolist(), strict=True))
    group_bytes = GROUP_SAMPLES * max(length.values())
    for node in ("node0", "node1"):
        logs0 = [r["epochs"]["0"] for r in first if r["node"] == node]
        fetched = sum(log["store_bytes"] for log in logs0)
        gets = sum(log["store_gets"] for log in logs0)
        delivered = sum(length[k] for log in logs0 for step in log["steps"] for k in step)
        print(f"{node}: {fetched} bytes in {gets} GETs, {fetched / shard_bytes:.3f} of the shards")
        slack = 4 * group_bytes + 2 * PAGE_BYTES * gets + len(logs0) * index_bytes
        assert delivered <= fetched <= delivered + slack
        assert 0.4 <= fetched / shard_bytes <= 0.65

    # Epoch 1: 4 ranks to the checkpoint at step 4, then node 0 alone on a world of 2.
    before = Counter(
        k for r in first for step in r["epochs"]["1"]["steps"][:STEPS_BEFORE_KILL] for k in step
    )
    assert sum(before.values()) == 4 * STEPS_BEFORE_KILL * 8
    assert [(r["rank"], r["node"], r["world_size"]) for r in second] == [
        (0, "node0", 2),
        (1, "node0", 2),
    ]
    for record in second:
        assert record["resumed_from"]["epoch"] == 1
        assert record["resumed_from"]["batches"] == STEPS_BEFORE_KILL
        assert record["resumed_from"]["world_size"] == 4
        assert record["epochs"]["1"]["complete"]
    after = Counter(k for r in second for step in r["epochs"]["1"]["steps"] for k in step)
    assert not set(before) & set(after)
    assert set(before.values()) | set(after.values()) == {1}
    assert len(before) + len(after) == SAMPLES
