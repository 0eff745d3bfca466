"""Run by test_startup_storm.py and benchmarks/startup_storm.py, one process per rank: open
a dataset and take one batch.

Usage: python startup_child.py SPEC_JSON, where SPEC_JSON holds ``url``, ``options``
(storage options), ``rank``, ``world_size``, ``batch_size``, ``cache_dir`` (or null),
``launched_at`` (the wall time the processes were started), ``ready`` (a file to create once
stoker is imported), ``go`` (a file to wait for, as ranks wait at a barrier, holding the wall
time it was made) and ``out`` (a JSON file to write). Writes the first batch's sample ids,
the seconds from the launch to stoker imported, from the go to the first batch, and the
loader's request counters.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from stoker import CacheConfig, Loader, World

IMPORTED = time.time()


def main() -> None:
    spec = json.loads(sys.argv[1])
    Path(spec["ready"]).touch()
    go = Path(spec["go"])
    while not go.is_file():
        time.sleep(0.001)
    go_at = float(go.read_text())
    with Loader(
        spec["url"],
        batch_size=spec["batch_size"],
        world=World(rank=spec["rank"], world_size=spec["world_size"]),
        cache=CacheConfig(dir=spec["cache_dir"]),
        storage_options=spec["options"],
    ) as loader:
        batch = next(iter(loader))
        first_batch_s = time.time() - go_at
        requests = loader.stats().requests
    out = {
        "ids": [int(i) for i in batch["index"]],
        "imported_s": IMPORTED - spec["launched_at"],
        "first_batch_s": first_batch_s,
        "requests": requests,
    }
    Path(spec["out"]).write_text(json.dumps(out))


if __name__ == "__main__":
    main()
