"""``stoker demo``: the whole job, end to end, on generated data with no credentials.

A folder of small JPEGs goes into a real S3 server (SeaweedFS on loopback) behind a proxy
that adds a cloud-like round trip. Then the four ways to train on it are timed (download
one by one, download in parallel, stream the small files, pack then stream: see
:mod:`stoker.profile.compare`), the packed copy is checked byte for byte against the
originals, the doctor says what limits streaming it, and a grid shows what the model sees:
nine samples of one training batch. The images are real photographs (random crops of the
photographs in scikit-image, ``pip install 'stoker[bench]'``) where that is installed,
else generated ones, with a note. It writes ``compare.png``, ``doctor.png``, ``trace.json``
and ``grid.png``.
"""

from __future__ import annotations

import contextlib
import hashlib
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from stoker.core.units import format_bytes
from stoker.errors import StokerError
from stoker.format.reader import open_dataset
from stoker.pipeline.loader import Loader
from stoker.pipeline.transforms import RandomResizedCrop
from stoker.profile.advice import format_diagnosis
from stoker.profile.compare import CompareConfig, compare_methods, format_comparison
from stoker.profile.comparison import CompareRow, Comparison
from stoker.profile.diagnosis import Diagnosis
from stoker.profile.doctor import diagnose
from stoker.profile.grid import save_sample_grid
from stoker.profile.plots import render_comparison, render_doctor, save_png
from stoker.profile.trace import write_chrome_trace
from stoker.storage import open_store
from stoker.storage.transfer import TransferConfig, upload
from stoker.testing.images import write_image_folder
from stoker.testing.netproxy import LinkConfig, NetProxy
from stoker.testing.photos import write_photo_folder
from stoker.testing.seaweed import SeaweedServer

BUCKET = "stoker-demo"
# The one-at-a-time download is timed on this many files (it is slow by design) and scaled.
SEQUENTIAL_SAMPLE = 200
#: Batch size, training step and length of the doctor's run: 64 images in 25 ms is about
#: ResNet-50 training on one A100 (~2,500 images/s).
DOCTOR_BATCH = 64
DOCTOR_STEP_S = 0.025
DOCTOR_SECONDS = 3.0
_IMAGES_URL = f"s3://{BUCKET}/images"
_PACKED_URL = f"s3://{BUCKET}/packed"
_OUTPUTS = ("compare.png", "doctor.png", "trace.json", "grid.png")


def _digest(data: bytes | memoryview) -> str:
    return hashlib.md5(data, usedforsecurity=False).hexdigest()


def _check_packed(url: str, options: dict[str, Any], originals: list[Path]) -> int:
    """Every original is in the packed dataset, byte for byte; return the count checked."""
    dataset = open_dataset(url, storage_options=options)
    packed = sorted(_digest(s["jpg"]) for s in dataset.read_many(range(len(dataset))))
    wanted = sorted(_digest(p.read_bytes()) for p in originals)
    if packed != wanted:
        missing = len(set(wanted) - set(packed))
        raise StokerError(f"{url}: {missing} of {len(wanted)} images differ from the originals")
    return len(wanted)


@contextlib.contextmanager
def cloud_link(
    upstream_port: int, link: LinkConfig, port: int | None, *, upstream_host: str = "127.0.0.1"
) -> Iterator[NetProxy]:
    """The delaying proxy in front of a local server, listening on ``port`` of 127.0.0.1
    (None: a free one), as ``stoker demo`` and ``stoker bench --compare --rtt-ms`` run it.

    Raises:
        ValueError: ``upstream_host`` is not a loopback address.
        StokerError: ``port`` is taken (naming it).
    """
    proxy = NetProxy(upstream_host, upstream_port, link=link, listen_port=port or 0)
    try:
        proxy.start()
    except OSError as exc:
        raise StokerError(
            f"cannot listen on 127.0.0.1:{port}: {exc.strerror or exc}; give another --port"
        ) from exc
    try:
        yield proxy
    finally:
        proxy.stop()


def _write_images(root: Path, files: int) -> tuple[list[Path], str]:
    """Photographs where scikit-image is installed, else generated images; and which."""
    try:
        return write_photo_folder(root, files=files, width=160, height=120, classes=10), (
            "photographs"
        )
    except ImportError:
        return write_image_folder(root, files=files), "generated"


def run_demo(
    *,
    files: int,
    rtt_s: float,
    workers: int,
    out_dir: str | Path,
    log: Callable[[str], None] | None = None,
    port: int | None = None,
    server_port: int | None = None,
) -> dict[str, Any]:
    """Run the demo and return its measurements.

    Args:
        files: JPEGs to generate (about 7 KB each).
        rtt_s: Round trip added to every request by the emulated cloud link.
        workers: Files in flight for the upload and the parallel download.
        out_dir: Where the pictures and the trace go (created if missing).
        log: Receives one line per step; None for silence.
        port: Port of 127.0.0.1 for the emulated cloud link, the endpoint every request
            goes to (default: a free one).
        server_port: Port of 127.0.0.1 for SeaweedFS's S3 gateway behind the link
            (default: a free one); its internal ports are free ones.

    Raises:
        StokerError: A step failed, or the packed copy differs from the originals.
    """
    say = log or (lambda _line: None)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="stoker-demo-"))
    started = time.perf_counter()
    try:
        paths, kind, total = _make_images(work / "images", files, say)
        with SeaweedServer(port=server_port) as server:
            server.create_bucket(BUCKET)
            link = LinkConfig(rtt_s=rtt_s, bandwidth_bytes_s=125e6)
            with cloud_link(server.port, link, port) as proxy:
                say(
                    f"[2/6] SeaweedFS S3 server on {server.endpoint}, reached through an "
                    f"emulated cloud link on {proxy.endpoint} ({rtt_s * 1000:g} ms round trip, "
                    f"1 Gbit/s)"
                )
                options = server.storage_options(proxy.endpoint)
                endpoint, server_endpoint = proxy.endpoint, server.endpoint
                up = upload(
                    work / "images",
                    open_store(_IMAGES_URL, storage_options=options),
                    config=TransferConfig(workers=workers),
                )
                say(f"[3/6] uploaded with stoker: {up.files_per_s:,.0f} files/s")
                comparison, verified = _compare(options, work, out, paths, workers=workers, say=say)
                diagnosis = _doctor(options, out, say)
                _sample_grid(options, out)
                say(f"[6/6] wrote compare.png, doctor.png, trace.json and grid.png to {out}")
        _print_results(comparison, diagnosis, say)
        rows = {row.method[:3]: row for row in comparison.rows}
        seconds = time.perf_counter() - started
        _say_summary(rows, files=files, seconds=seconds, out=out, say=say)
        return {
            "files": files,
            "images": kind,
            "bytes": total,
            "rtt_ms": rtt_s * 1000,
            "endpoint": endpoint,
            "server_endpoint": server_endpoint,
            "workers": workers,
            "upload_files_per_s": round(up.files_per_s, 1),
            "sequential_files_per_s": round(files / max(rows["(a)"].setup_s, 1e-9), 1),
            "parallel_files_per_s": round(files / max(rows["(b)"].setup_s, 1e-9), 1),
            "comparison": comparison.to_dict(),
            "verified_files": verified,
            "doctor": diagnosis.to_dict(),
            "outputs": {name: str(out / name) for name in _OUTPUTS},
            "seconds": round(seconds, 1),
        }
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _make_images(
    source: Path, files: int, say: Callable[[str], None]
) -> tuple[list[Path], str, int]:
    """Step 1: the JPEGs in class folders under ``source``, which kind they are, and their
    bytes."""
    paths, kind = _write_images(source, files)
    total = sum(p.stat().st_size for p in paths)
    if kind == "photographs":
        say(
            f"[1/6] made {files} JPEGs ({format_bytes(total)}) in class folders: random "
            "crops of scikit-image's photographs"
        )
    else:
        say(
            f"[1/6] generated {files} synthetic JPEGs ({format_bytes(total)}) in class "
            "folders (for real photographs: pip install 'stoker[bench]', which brings "
            "scikit-image)"
        )
    return paths, kind, total


def _compare(
    options: dict[str, Any],
    work: Path,
    out: Path,
    paths: list[Path],
    *,
    workers: int,
    say: Callable[[str], None],
) -> tuple[Comparison, int]:
    """Step 4: the four ways to train on the uploaded images, drawn as compare.png; and the
    packed copy checked against the originals (the images checked)."""
    say("[4/6] four ways to train on them, each to its first batch and one epoch:")
    comparison = compare_methods(
        _IMAGES_URL,
        pack_to=_PACKED_URL,
        storage_options=options,
        config=CompareConfig(
            limit=len(paths),
            batch_size=DOCTOR_BATCH,
            download_workers=workers,
            sequential_limit=SEQUENTIAL_SAMPLE,
        ),
        workdir=work,
        keep_packed=True,
        log=lambda line: say(f"      {line}"),
    )
    save_png(render_comparison(comparison), out / "compare.png")
    verified = _check_packed(_PACKED_URL, options, paths)
    say(
        f"      verified: all {verified} images in the packed dataset match "
        "their originals byte for byte (MD5)"
    )
    return comparison, verified


def _doctor(options: dict[str, Any], out: Path, say: Callable[[str], None]) -> Diagnosis:
    """Step 5: the doctor's run on the packed copy, drawn as doctor.png and traced."""
    with Loader(
        _PACKED_URL,
        batch_size=DOCTOR_BATCH,
        transform=RandomResizedCrop(224, flip=True),
        storage_options=options,
    ) as loader:
        diagnosis = diagnose(loader, step_s=DOCTOR_STEP_S, seconds=DOCTOR_SECONDS, advice_for="cli")
    save_png(render_doctor(diagnosis), out / "doctor.png")
    write_chrome_trace(diagnosis.events, out / "trace.json", origin_s=diagnosis.origin_s)
    say(
        f"[5/6] doctor, streaming the packed copy at a {DOCTOR_STEP_S * 1000:g} ms "
        f"step: {diagnosis.summary()}"
    )
    return diagnosis


def _sample_grid(options: dict[str, Any], out: Path) -> None:
    """What the model sees: nine samples of one training batch, as mixed as it."""
    with Loader(
        _PACKED_URL,
        batch_size=DOCTOR_BATCH,
        transform=RandomResizedCrop(160, flip=True),
        storage_options=options,
    ) as loader:
        save_sample_grid(loader, out / "grid.png")


def _print_results(
    comparison: Comparison, diagnosis: Diagnosis, say: Callable[[str], None]
) -> None:
    for table in (format_comparison(comparison), format_diagnosis(diagnosis)):
        say("")
        for line in table.splitlines():
            say(line)


def _say_summary(
    rows: dict[str, CompareRow],
    *,
    files: int,
    seconds: float,
    out: Path,
    say: Callable[[str], None],
) -> None:
    say("")
    say(
        f"Packed, the {files} images stream with {rows['(d)'].requests_per_epoch:,} GETs per "
        f"epoch instead of {rows['(c)'].requests_per_epoch:,} (one per file), and the first "
        f"batch comes {rows['(a)'].first_batch_s / max(rows['(d)'].first_batch_s, 1e-9):.0f}x "
        f"sooner than after a one-by-one download. Total demo time {seconds:.1f} s."
    )
    say(f"Open {out / 'trace.json'} in ui.perfetto.dev to see every stage on every thread.")
