"""Run by test_throttled_runs.py, one process per rank: read one epoch of a dataset.

Usage: python throttled_rank_child.py SPEC_JSON, where SPEC_JSON holds ``url``, ``options``
(storage options), ``rank``, ``world_size``, ``batch_size`` and ``out`` (a JSON file to
write). Writes the sample ids the rank delivered, in order, and its store's counters.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from stoker import Loader, World
from stoker.pipeline.order import OrderConfig
from stoker.pipeline.transforms import RandomResizedCrop


def main() -> None:
    spec = json.loads(sys.argv[1])
    with Loader(
        spec["url"],
        batch_size=spec["batch_size"],
        transform=RandomResizedCrop(8),
        order=OrderConfig(mode="random"),
        prefetch=spec.get("prefetch", "auto"),
        world=World(rank=spec["rank"], world_size=spec["world_size"]),
        storage_options=spec["options"],
    ) as loader:
        ids = [int(i) for batch in loader for i in batch["index"]]
        requests = loader.stats().requests
    Path(spec["out"]).write_text(json.dumps({"ids": ids, "requests": requests}))


if __name__ == "__main__":
    main()
