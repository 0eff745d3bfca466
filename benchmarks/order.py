"""Label mix and read cost of the Loader's default order, on the benchmark sets' real sizes.

For each set, the samples' real byte sizes and class labels are read from its image folder
(``benchmarks/loader.py`` makes them under ``benchmarks/out/data``), laid out in shards as
``stoker pack`` cuts them (by bytes, ``DEFAULT_SHARD_BYTES``), in two orders: shuffled, as
pack writes by default, and class by class, as ``pack --keep-order`` (or an older pack,
or tars indexed in place) leaves them. Each layout is then read with two order settings,
both from stoker's own functions (``resolve_order``, ``epoch_order``, ``assign``,
``label_mix``, ``read_cost``; nothing here re-implements them):

* **groups only**: what the Loader did before the window (``resolve_order`` as for
  shuffled data: ~1 MB blocks, read groups of 16, ``window=1``), whatever the layout;
* **default**: what the Loader does now (``shuffled=`` from the layout).

Printed per row: distinct labels per batch against a uniform permutation (2 ranks, epochs
0 and 1), ranged reads per epoch over both ranks against the groups-only row of the
shuffled layout, the median read, and what the window holds.

    python benchmarks/order.py              # set a, set b and a 100 x 30 subset of set a
    python benchmarks/order.py --batch 256 --ranks 2

Writes benchmarks/out/order.json.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from stoker.pack.packer import DEFAULT_SHARD_BYTES
from stoker.pipeline.order import assign
from stoker.pipeline.plan import resolve_order
from stoker.pipeline.quality import label_mix, read_cost

OUT = Path(__file__).parent / "out"
DATA = OUT / "data"


def folder_sizes(root: Path, per_class: int | None) -> tuple[np.ndarray, np.ndarray]:
    """Labels and byte sizes of a class-folder tree, class by class in sorted order."""
    labels, sizes = [], []
    for label, folder in enumerate(sorted(p for p in root.iterdir() if p.is_dir())):
        files = sorted(folder.iterdir())[:per_class]
        labels += [label] * len(files)
        sizes += [f.stat().st_size + 1024 for f in files]  # + the tar member's header
    return np.asarray(labels, dtype=np.int64), np.asarray(sizes, dtype=np.int64)


def shard_sizes(lengths: np.ndarray) -> list[int]:
    """Samples per shard when cut by cumulative bytes, as ``stoker pack`` cuts them."""
    counts, total, count = [], 0, 0
    for length in lengths.tolist():
        if count and total + length > DEFAULT_SHARD_BYTES:
            counts.append(count)
            total, count = 0, 0
        total += length
        count += 1
    return [*counts, count] if count else counts


def measure(
    labels: np.ndarray,
    lengths: np.ndarray,
    *,
    shuffled: bool,
    policy: str,
    args: argparse.Namespace,
) -> dict[str, object]:
    sizes = shard_sizes(lengths)
    config = resolve_order(
        None,
        seed=0,
        units=len(labels),
        unit_bytes=float(lengths.mean()),
        shuffled=shuffled if policy == "default" else True,
    )
    started = time.perf_counter()
    streams = []
    from stoker.pipeline.order import epoch_order

    for epoch in (0, 1):
        order = epoch_order(sizes, config=config, epoch=epoch)
        streams += [assign(order, rank=r, world_size=args.ranks).samples for r in range(args.ranks)]
    mix = label_mix(labels, streams, batch_size=args.batch)
    order = epoch_order(sizes, config=config, epoch=0)
    cost = read_cost(lengths, sizes, order=order, config=config, world_size=args.ranks)
    return {
        "block_size": config.block_size,
        "group_blocks": config.group_blocks,
        "window": config.windows,
        "distinct_ratio": round(mix.distinct_ratio, 3),
        "distinct_labels": round(mix.mean_distinct_labels, 1),
        "uniform_labels": round(mix.uniform_distinct_labels, 1),
        "requests": cost.requests,
        "median_read_kB": round(cost.median_read_bytes / 1000, 1),
        "window_MB": round(cost.window_bytes / 1e6, 1),
        "seconds": round(time.perf_counter() - started, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=256, help="batch size (default 256)")
    parser.add_argument("--ranks", type=int, default=2, help="ranks (default 2)")
    args = parser.parse_args()
    sets = {
        "a": (DATA / "a", None),
        "b": (DATA / "b", None),
        "a, 100 x 30": (DATA / "a", 30),
    }
    rows = []
    for name, (root, per_class) in sets.items():
        if not root.is_dir():
            print(f"skipping set {name}: {root} missing (python benchmarks/loader.py makes it)")
            continue
        sorted_labels, sorted_lengths = folder_sizes(root, per_class)
        shuffle = np.random.default_rng(0).permutation(len(sorted_labels))
        layouts = {
            "shuffled": (sorted_labels[shuffle], sorted_lengths[shuffle], True),
            "class-sorted": (sorted_labels, sorted_lengths, False),
        }
        baseline = None
        for layout, (labels, lengths, shuffled) in layouts.items():
            for policy in ("groups only", "default"):
                row = measure(labels, lengths, shuffled=shuffled, policy=policy, args=args)
                baseline = baseline or row["requests"]
                row.update(set=name, samples=len(labels), layout=layout, order=policy)
                row["requests_vs_before"] = round(int(row["requests"]) / int(baseline), 2)
                rows.append(row)
    header = (
        "| set | layout | order | block x group, window | distinct labels / uniform | "
        "reads per epoch (vs shuffled, groups only) | median read | window holds |"
    )
    print(header)
    print("| --- | --- | --- | --- | ---: | ---: | ---: | ---: |")
    for r in rows:
        print(
            f"| {r['set']} ({r['samples']:,}) | {r['layout']} | {r['order']} | "
            f"{r['block_size']} x {r['group_blocks']}, {r['window']} | "
            f"{r['distinct_ratio']:.3f} ({r['distinct_labels']} / {r['uniform_labels']}) | "
            f"{r['requests']:,} ({r['requests_vs_before']:.2f}x) | "
            f"{r['median_read_kB']:,.0f} kB | {r['window_MB']:,.0f} MB |"
        )
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "order.json").write_text(json.dumps({"args": vars(args), "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
