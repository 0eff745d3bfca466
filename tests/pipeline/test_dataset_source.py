"""DatasetSource's reads: through a disk cache, samples less than a page apart are one run
(issue 33 item 8)."""

from __future__ import annotations

from pathlib import Path

from stoker.pipeline.config import BLOCK_PAGE_BYTES, CacheConfig
from stoker.pipeline.sources import open_source
from stoker.storage.engine import default_engine
from stoker.testing.images import write_packed_images


def test_through_a_disk_cache_a_blocks_samples_apart_are_read_with_one_request(
    tmp_path: Path,
) -> None:
    """Every other sample of a run of a shard (another worker's samples between them),
    read through a disk cache: one GET, as the pages they touch are adjacent (with no gap
    read through, each page was a GET of its own: 4)."""
    url = write_packed_images(tmp_path, files=400, width=160, height=120, samples_per_shard=400)
    cache = CacheConfig(dir=tmp_path / "cache")
    source = open_source(url, storage_options=None, cache=cache, page_bytes=BLOCK_PAGE_BYTES)
    store = source.datasets[0].store
    wanted = list(range(0, 400, 2))  # over four pages
    before = store.counters.get("requests.get")  # the index's
    samples = default_engine().run(source.read_async(wanted))
    assert [s["key"] for s in samples] == [source.datasets[0].index.keys[i] for i in wanted]
    assert store.counters.get("requests.get") - before == 1
