"""``stoker demo``: the main job, end to end, on generated data with no credentials.

It tells the story of the transfer layer today: a folder of small JPEGs goes into a real S3
server (SeaweedFS on loopback) behind a proxy that adds a cloud-like round trip, comes back
one file at a time (what a naive script does) and in parallel (what stoker does), and every
byte is checked against the original.
"""

from __future__ import annotations

import hashlib
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from stoker.core.units import format_bytes
from stoker.errors import StokerError
from stoker.storage import open_store
from stoker.storage.transfer import TransferConfig, download, upload
from stoker.testing.images import write_image_folder
from stoker.testing.netproxy import LinkConfig, NetProxy
from stoker.testing.seaweed import SeaweedServer

BUCKET = "stoker-demo"
# The one-at-a-time baseline is timed on this many files (it is slow by design).
SEQUENTIAL_SAMPLE = 200


def _digest(path: Path) -> str:
    return hashlib.md5(path.read_bytes(), usedforsecurity=False).hexdigest()


def run_demo(
    *,
    files: int,
    rtt_s: float,
    workers: int,
    log: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Run the demo and return its measurements.

    Args:
        files: JPEGs to generate (about 7 KB each).
        rtt_s: Round trip added to every request by the emulated cloud link.
        workers: Files in flight for the parallel transfers.
        log: Receives one line per step; None for silence.

    Raises:
        StokerError: A step failed, or a downloaded file differs from its original.
    """
    say = log or (lambda _line: None)
    work = Path(tempfile.mkdtemp(prefix="stoker-demo-"))
    try:
        source, parallel_dir, sequential_dir = (
            work / "images",
            work / "parallel",
            work / "one-by-one",
        )
        started = time.perf_counter()
        paths = write_image_folder(source, files=files)
        total = sum(p.stat().st_size for p in paths)
        say(f"[1/5] generated {files} JPEGs ({format_bytes(total)}) in {source}")

        with SeaweedServer() as server:
            server.create_bucket(BUCKET)
            link = LinkConfig(rtt_s=rtt_s, bandwidth_bytes_s=125e6)
            with NetProxy("127.0.0.1", server.port, link=link) as proxy:
                say(
                    f"[2/5] SeaweedFS S3 server on {server.endpoint}, reached through an "
                    f"emulated cloud link on {proxy.endpoint} ({rtt_s * 1000:g} ms round trip, "
                    f"1 Gbit/s)"
                )
                options = server.storage_options(proxy.endpoint)
                store = open_store(f"s3://{BUCKET}/images", storage_options=options)
                config = TransferConfig(workers=workers)
                up = upload(source, store, config=config)
                say(f"[3/5] uploaded with stoker: {up.files_per_s:,.0f} files/s")

                keys = sorted(p.relative_to(source).as_posix() for p in paths)
                sample = keys[:SEQUENTIAL_SAMPLE]
                t0 = time.perf_counter()
                for key in sample:
                    target = sequential_dir / key
                    target.parent.mkdir(parents=True, exist_ok=True)
                    target.write_bytes(store.get(key))
                sequential_s = time.perf_counter() - t0
                sequential_rate = len(sample) / sequential_s
                say(
                    f"[4/5] one GET at a time (a naive loop), first {len(sample)} files: "
                    f"{sequential_rate:,.0f} files/s"
                )
                down = download(store, parallel_dir, config=config)
                say(
                    f"      stoker download, all {down.files_transferred} files, {workers} in "
                    f"flight: {down.files_per_s:,.0f} files/s"
                )

        bad = [p for p in paths if _digest(p) != _digest(parallel_dir / p.relative_to(source))]
        if bad:
            raise StokerError(f"{len(bad)} downloaded files differ from their originals: {bad[:5]}")
        speedup = down.files_per_s / sequential_rate if sequential_rate else float("inf")
        say(f"[5/5] verified: all {files} files match their originals byte for byte (MD5)")
        say("")
        say(f"  {'method':<34} {'files/s':>10}")
        say(f"  {'one GET at a time':<34} {sequential_rate:>10,.0f}")
        say(f"  {'stoker download':<34} {down.files_per_s:>10,.0f}")
        say(f"  speed-up: {speedup:.1f}x   (total demo time {time.perf_counter() - started:.1f} s)")
        return {
            "files": files,
            "bytes": total,
            "rtt_ms": rtt_s * 1000,
            "workers": workers,
            "upload_files_per_s": round(up.files_per_s, 1),
            "sequential_files_per_s": round(sequential_rate, 1),
            "sequential_sample": len(sample),
            "parallel_files_per_s": round(down.files_per_s, 1),
            "speedup": round(speedup, 2),
            "verified_files": files,
            "retries": down.requests.get("retries", 0),
        }
    finally:
        shutil.rmtree(work, ignore_errors=True)
