"""TorchLoader's workers read together (issue 33 item 8): each makes its own batches of
every read group, and through the disk cache they share (theirs, or a temporary one of the
loader's) a block's pages are fetched once for the node, with one request."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import pytest

from stoker import Loader
from stoker.integrations.torch import TorchLoader
from stoker.integrations.worker_cache import WorkerCache
from stoker.pack.packer import pack
from stoker.pipeline.config import CacheConfig, LoaderOptions, SourceConfig
from stoker.pipeline.mixing import MixConfig
from stoker.testing.images import write_image_folder
from stoker.testing.netproxy import NetProxy
from stoker.testing.seaweed import SeaweedServer


def _shard_gets(proxy: NetProxy) -> int:
    return sum(m == "GET" and ".tar" in target for m, target, _ in proxy.requests_seen())


def test_two_workers_make_the_requests_of_one_process(
    s3_bucket: Any, s3_server: SeaweedServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One epoch of a packed set in a bucket, counted at the server: TorchLoader with two
    workers and no cache given asks for the shards at most 1.2x as often as one Loader
    (before: 760 against 5, each worker reading the runs of its own samples), and
    delivers every sample once; its temporary cache is gone after close()."""
    write_image_folder(tmp_path / "src", files=1000, classes=10, width=160, height=120)
    url = f"{s3_bucket.url}/ds"
    pack(tmp_path / "src", url, storage_options=s3_bucket.options())
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    with NetProxy("127.0.0.1", s3_server.port, record_requests=True) as proxy:
        options = s3_bucket.options(proxy.endpoint)
        with Loader(url, batch_size=32, storage_options=options) as alone:
            keys = [k for batch in alone for k in batch["key"]]
        alone_gets = _shard_gets(proxy)
        with TorchLoader(url, batch_size=32, num_workers=2, storage_options=options) as loader:
            got = [k for batch in loader for k in batch["key"]]
            made = list((tmp_path / "tmp").iterdir())
        workers_gets = _shard_gets(proxy) - alone_gets
    assert len(keys) == len(set(keys)) == 1000
    assert sorted(got) == sorted(keys)
    assert alone_gets >= 4  # a block (of about 4 MB) a request
    assert workers_gets <= 1.2 * alone_gets, (workers_gets, alone_gets)
    assert [p.name.startswith("stoker-workers-") for p in made] == [True]
    assert not list((tmp_path / "tmp").iterdir())


def test_a_worker_cache_is_made_for_several_workers_of_a_bucket_and_removed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    given = CacheConfig(memory_bytes=1 << 20)
    options: LoaderOptions = {"cache": given, "seed": 3}
    cache = WorkerCache()
    cache.open(options, "s3://bucket/ds", workers=2)
    made = options["cache"]
    assert made is not None
    assert made.dir is not None
    assert Path(made.dir).is_dir()
    assert Path(made.dir).parent == tmp_path
    assert made.memory_bytes == 1 << 20
    assert made.max_bytes is not None
    assert made.max_bytes <= 1 << 30
    cache.close(options)
    assert options == {"cache": given, "seed": 3}
    assert not Path(made.dir).exists()
    plain: LoaderOptions = {}
    cache.open(
        plain, SourceConfig(["/local/a", "s3://bucket/b"], mix=MixConfig(weights=(1, 1))), workers=3
    )
    assert plain["cache"] is not None
    cache.close(plain)
    assert plain == {}
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize(
    ("source", "workers", "given"),
    [
        ("s3://bucket/ds", 1, None),  # one worker shares with no one
        ("s3://bucket/ds", 2, CacheConfig(dir="/somewhere/else")),  # the caller's
        ("/local/ds", 2, None),  # local files are read where they lie
        (object(), 2, None),  # a prebuilt source carries its own cache
    ],
)
def test_a_worker_cache_leaves_other_settings_alone(
    source: Any, workers: int, given: CacheConfig | None, tmp_path: Path
) -> None:
    options: LoaderOptions = {} if given is None else {"cache": given}
    before = dict(options)
    cache = WorkerCache()
    cache.open(options, source, workers=workers)
    assert options == before
    assert cache.directory is None
    cache.close(options)
    assert options == before
