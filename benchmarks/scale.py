"""A model of a big run: request rates, link load, cache hits and first-batch time at scale.

A dataset of 2M images / 200 GB read by 64 nodes x 8 ranks at 3,000 images/s per rank. The
order and each rank's share come from stoker's own functions (``resolve_order``,
``epoch_order``, and ``plan_epoch``, which partitions with ``assign`` and cuts the fetch
chunks the Loader requests), and shard keys from ``shard_key``; nothing here
re-implements them, so the model follows when they change. What it adds is the data and
the clock:

* sample sizes: log-normal (sigma 0.5) around the mean, in tar members, cut into shards by
  cumulative bytes as ``plan_shards`` does;
* each rank consumes its share at the target rate, all ranks in step (synchronous data
  parallel); a fetch chunk is requested when its rank reaches the chunk's first sample
  (prefetch moves every request earlier by the same amount, which leaves rates alone);
* a chunk's samples become ranged GETs as the Loader has ``ShardDataset.read_many``
  coalesce them (one per run of one shard with gaps of at most ``LOADER_MAX_GAP_BYTES``).
  The count is vectorised here and checked against the reader's own ``plan_runs`` on every
  rank of node 0;
* the node's disk cache keeps 1 MiB pages (``BLOCK_PAGE_BYTES``) and drops the least
  recently used; a miss fetches whole pages. Epoch 2's hits are pages still there from
  epoch 1, or pages read earlier in epoch 2;
* first-batch time adds stated latencies (``--ttfb-s``, ``--stream-mb-per-s``) to the
  measured cost of stoker's own work: ``read_index`` of the modelled 2M-sample index, the
  epoch's order and the rank's plan.

Every rank of every node is modelled (vectorised with numpy), or with ``--model-nodes K``
the ranks of K nodes spread over the job, their request counts scaled to all nodes (the
busiest-bin peaks then read a little high: the sampled counts are noisier).

    python benchmarks/scale.py
    python benchmarks/scale.py --nodes 16 --prefix-limit 3500 --link-gbit 100

Writes benchmarks/out/scale.json and benchmarks/out/scale.md.
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path
from typing import Any

import numpy as np

from stoker.format.index import DatasetIndex, ShardEntry, read_index, write_index
from stoker.format.reader import DEFAULT_MAX_RUN_BYTES
from stoker.format.runs import plan_runs
from stoker.format.spec import MAX_PREFIXES, TAR_BLOCK, shard_key
from stoker.pack.packer import DEFAULT_SHARD_BYTES
from stoker.pipeline.config import BLOCK_PAGE_BYTES
from stoker.pipeline.order import OrderConfig, epoch_order
from stoker.pipeline.plan import plan_epoch, resolve_order
from stoker.pipeline.sources import LOADER_MAX_GAP_BYTES
from stoker.pipeline.world import World
from stoker.storage.memory import MemoryStore

OUT = Path(__file__).resolve().parent / "out"
MB = 1e6
KEY_BYTES = 24  # "n01440764/n01440764_1002": an ImageNet-style key


def make_dataset(args: argparse.Namespace) -> dict[str, np.ndarray]:
    """Per-sample span, shard and offset; shards cut by cumulative bytes."""
    rng = np.random.default_rng(args.seed)
    mean = args.dataset_gb * 1e9 / args.samples
    sigma = 0.5
    sizes = rng.lognormal(np.log(mean) - sigma**2 / 2, sigma, args.samples)
    # The image member padded to 512 bytes, its header, and a .cls member (header + block).
    spans = (np.ceil(sizes / TAR_BLOCK) * TAR_BLOCK + 3 * TAR_BLOCK).astype(np.int64)
    ends = np.cumsum(spans)
    shard = (ends - 1) // args.shard_bytes
    _, shard = np.unique(shard, return_inverse=True)
    shard_sizes = np.bincount(shard)
    first = np.concatenate([[0], np.cumsum(shard_sizes)[:-1]])
    shard_start_bytes = (ends - spans)[first]
    offset = ends - spans - shard_start_bytes[shard]
    return {"span": spans, "shard": shard, "offset": offset, "shard_sizes": shard_sizes}


def index_of(data: dict[str, np.ndarray]) -> DatasetIndex:
    """A real DatasetIndex of the modelled dataset (for plan_runs and read_index)."""
    n = len(data["span"])
    sizes = np.bincount(data["shard"], weights=data["span"]).astype(np.int64) + 2 * TAR_BLOCK
    return DatasetIndex(
        shards=[
            ShardEntry(shard_key(s), int(c), int(b), "0" * 64)
            for s, (c, b) in enumerate(zip(data["shard_sizes"], sizes, strict=True))
        ],
        class_names=[f"class_{c:03d}" for c in range(1000)],
        fields={"cls": n, "jpg": n},
        shard=data["shard"].astype("<u4"),
        offset=data["offset"].astype("<u8"),
        length=data["span"].astype("<u8"),
        label=np.arange(n, dtype="<i8") % 1000,
        crc32=np.zeros(n, dtype="<u4"),
        keys=[f"{i:0{KEY_BYTES}d}" for i in range(n)],
    )


def chunk_runs(chunks: list[np.ndarray], data: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The ranged GETs of each chunk, as read_many coalesces them (vectorised plan_runs).

    Returns per GET: the chunk it serves, shard, first byte and end byte.
    """
    lengths = [len(c) for c in chunks]
    ids = np.concatenate(chunks)
    chunk = np.repeat(np.arange(len(chunks)), lengths)
    order = np.lexsort((ids, chunk))  # global ids sort as (shard, offset) do
    ids, chunk = ids[order], chunk[order]
    keep = np.ones(len(ids), bool)
    keep[1:] = (ids[1:] != ids[:-1]) | (chunk[1:] != chunk[:-1])
    ids, chunk = ids[keep], chunk[keep]
    shard, start = data["shard"][ids], data["offset"][ids]
    end = start + data["span"][ids]
    new = np.ones(len(ids), bool)
    new[1:] = (
        (chunk[1:] != chunk[:-1])
        | (shard[1:] != shard[:-1])
        | (start[1:] - end[:-1] > LOADER_MAX_GAP_BYTES)
    )
    run = np.cumsum(new) - 1
    run_end = np.zeros(run[-1] + 1, np.int64)
    np.maximum.at(run_end, run, end)
    # A run is also cut at DEFAULT_MAX_RUN_BYTES; chunks here are far smaller.
    return {"chunk": chunk[new], "shard": shard[new], "start": start[new], "end": run_end}


def epoch_reads(
    data: dict[str, np.ndarray],
    index: DatasetIndex,
    config: OrderConfig,
    epoch: int,
    args: argparse.Namespace,
) -> tuple[dict[str, np.ndarray], dict[str, float]]:
    """Every GET of every rank in one epoch, in time order: t (s), rank, node, shard, start,
    end; and the seconds stoker took to order the epoch and plan the slowest rank."""
    world_size = args.nodes * args.ranks_per_node
    started = time.perf_counter()
    order = epoch_order(data["shard_sizes"], config=config, epoch=epoch)
    order_s = time.perf_counter() - started
    names = ("t", "rank", "node", "shard", "start", "end")
    columns: dict[str, list[np.ndarray]] = {k: [] for k in names}
    plan_s = 0.0
    ranks = [n * args.ranks_per_node + r for n in args.modelled for r in range(args.ranks_per_node)]
    for rank in ranks:
        started = time.perf_counter()
        plan = plan_epoch(
            order,
            world=World(rank=rank, world_size=world_size),
            batch_size=args.batch_size,
            drop_last=False,
            group_samples=config.group_samples,
        )
        plan_s = max(plan_s, time.perf_counter() - started)
        runs = chunk_runs(plan.chunks, data)
        if epoch == 0 and rank < args.ranks_per_node:
            check_against_plan_runs(plan.chunks, runs, index)
        first_position = np.concatenate([[0], np.cumsum([len(c) for c in plan.chunks])[:-1]])
        count = len(runs["chunk"])
        columns["t"].append(first_position[runs["chunk"]] / args.rate)
        columns["rank"].append(np.full(count, rank))
        columns["node"].append(np.full(count, rank // args.ranks_per_node))
        for key in ("shard", "start", "end"):
            columns[key].append(runs[key])
    reads = {k: np.concatenate(v) for k, v in columns.items()}
    by_time = np.argsort(reads["t"], kind="stable")
    return {k: v[by_time] for k, v in reads.items()}, {"order_s": order_s, "plan_s": plan_s}


def check_against_plan_runs(
    chunks: list[np.ndarray], runs: dict[str, np.ndarray], index: DatasetIndex
) -> None:
    """The vectorised coalescing makes as many GETs as the reader's own plan_runs."""
    real = sum(
        len(
            plan_runs(
                index,
                sorted({int(i) for i in chunk}),
                max_gap_bytes=LOADER_MAX_GAP_BYTES,
                max_run_bytes=DEFAULT_MAX_RUN_BYTES,
            )
        )
        for chunk in chunks
    )
    if real != len(runs["chunk"]):
        raise RuntimeError(f"vectorised runs {len(runs['chunk'])} != plan_runs {real}")


def prefix_rates(
    reads: dict[str, np.ndarray],
    shards: int,
    prefixes: int,
    epoch_s: float,
    args: argparse.Namespace,
) -> dict[str, float]:
    """GETs per second on the busiest prefix (in its busiest bin) and on an average one,
    for all nodes (the modelled nodes' requests times nodes / modelled nodes)."""
    scale, bin_s = args.nodes / len(args.modelled), args.bin_s
    labels = [shard_key(n, prefixes=prefixes).rpartition("/")[0] for n in range(shards)]
    _, prefix_of_shard = np.unique(labels, return_inverse=True)
    prefix = prefix_of_shard[reads["shard"]]
    bins = (reads["t"] / bin_s).astype(np.int64)
    counts = np.bincount(bins * prefixes + prefix) * scale
    return {
        "prefixes": prefixes,
        "peak_get_per_s": float(counts.max() / bin_s),
        "mean_get_per_s": len(bins) * scale / epoch_s / prefixes,
    }


def prefixes_needed(reads: dict[str, np.ndarray], shards: int, args: argparse.Namespace) -> int:
    """Fewest prefixes whose busiest one stays under the limit in every time bin."""
    bins = (reads["t"] / args.bin_s).astype(np.int64)
    limit = args.prefix_limit * args.bin_s * len(args.modelled) / args.nodes
    for prefixes in range(1, min(shards, MAX_PREFIXES) + 1):
        prefix = reads["shard"] % prefixes  # shard_key puts shard n under label n % N
        if np.bincount(bins * prefixes + prefix).max() <= limit:
            return prefixes
    return -1


def node_pages(reads: dict[str, np.ndarray], node: int) -> tuple[np.ndarray, np.ndarray]:
    """The node's 1 MiB page reads in time order: one int64 id per (shard, page), and when."""
    mine = reads["node"] == node
    first = reads["start"][mine] // BLOCK_PAGE_BYTES
    count = (reads["end"][mine] - 1) // BLOCK_PAGE_BYTES - first + 1
    within = np.arange(int(count.sum())) - np.repeat(np.cumsum(count) - count, count)
    pages = np.repeat(reads["shard"][mine] << 32, count) + np.repeat(first, count) + within
    return pages, np.repeat(reads["t"][mine], count)


def first_reads(pages: np.ndarray) -> np.ndarray:
    """Mask of each page's first read."""
    first = np.zeros(len(pages), bool)
    first[np.unique(pages, return_index=True)[1]] = True
    return first


def node_load(
    reads: dict[str, np.ndarray],
    pages: dict[int, tuple[np.ndarray, np.ndarray]],
    epoch_s: float,
    mean_span: float,
    args: argparse.Namespace,
) -> dict[str, dict[str, float]]:
    """MB/s per node (busiest node in its busiest bin, and the mean): the ranged GETs, and
    the pages a disk cache fetches in epoch 1 (each page's first read on the node)."""
    link = args.link_gbit * 1e9 / 8 / MB
    bins = (reads["t"] / args.bin_s).astype(np.int64)
    cells = {"direct": (bins * args.nodes + reads["node"], reads["end"] - reads["start"])}
    paged_cells, paged_bytes = [], []
    for node, (ids, t) in pages.items():
        first = first_reads(ids)
        paged_cells.append((t[first] / args.bin_s).astype(np.int64) * args.nodes + node)
        paged_bytes.append(np.full(int(first.sum()), BLOCK_PAGE_BYTES))
    cells["paged"] = (np.concatenate(paged_cells), np.concatenate(paged_bytes))
    out = {}
    for name, (cell, nbytes) in cells.items():
        peak = float(np.bincount(cell, weights=nbytes).max()) / args.bin_s / MB
        mean = float(nbytes.sum()) / epoch_s / len(args.modelled) / MB
        out[name] = {
            "peak_mb_per_s": peak,
            "mean_mb_per_s": mean,
            "mean_link_share": mean / link,
            "peak_link_share": peak / link,
        }
    delivered = args.ranks_per_node * args.rate * mean_span / MB
    out["delivered"] = {
        "peak_mb_per_s": delivered,
        "mean_mb_per_s": delivered,
        "mean_link_share": delivered / link,
        "peak_link_share": delivered / link,
    }
    return out


def cache_hits(epoch1: np.ndarray, epoch2: np.ndarray, cache_bytes: float) -> dict[str, float]:
    """Share of epoch 2's page reads the node's LRU disk cache serves (see the module docs),
    and the share served by pages kept from epoch 1."""
    capacity = int(cache_bytes // BLOCK_PAGE_BYTES)
    # After epoch 1 the cache holds its most recently used pages; depth 0 is the newest.
    kept, last_use = np.unique(epoch1[::-1], return_index=True)
    depth_of_kept = np.argsort(np.argsort(last_use))
    keep = depth_of_kept < capacity
    kept, depth_of_kept = kept[keep], depth_of_kept[keep]
    # In epoch 2 each first read of a page pushes the kept pages one deeper (an upper bound
    # on evictions: a hit inserts nothing); a page read again within epoch 2 is a hit.
    first = first_reads(epoch2)
    inserted_before = np.cumsum(first) - first
    if len(kept):
        where = np.minimum(np.searchsorted(kept, epoch2), len(kept) - 1)
        found = kept[where] == epoch2
        depth = np.where(found, depth_of_kept[where], capacity)
    else:
        found, depth = np.zeros(len(epoch2), bool), np.full(len(epoch2), capacity)
    from_epoch1 = first & found & (depth + inserted_before < capacity)
    return {"hit_rate": float((~first | from_epoch1).mean()), "from_epoch1": from_epoch1.mean()}


def first_batch(
    index: DatasetIndex,
    reads: dict[str, np.ndarray],
    times: dict[str, float],
    args: argparse.Namespace,
) -> list[tuple[str, float]]:
    """Seconds from start to rank 0's first batch, by step (stated latencies + measured)."""
    store = MemoryStore("scale")
    write_index(store, index)
    index_bin = store.head("index.bin").size
    started = time.perf_counter()
    read_index(store)
    parse_s = time.perf_counter() - started
    stream = args.stream_mb_per_s * MB
    link_share = args.link_gbit * 1e9 / 8 / args.ranks_per_node
    first = (reads["t"] == 0.0) & (reads["rank"] == 0)
    first_chunk = (reads["end"] - reads["start"])[first]
    return [
        ("GET index.json (first byte; it is a few kB)", args.ttfb_s),
        (
            f"GET index.bin ({index_bin / MB:.0f} MB, one stream; 8 ranks share the link)",
            args.ttfb_s + index_bin / min(stream, link_share),
        ),
        ("read_index: parse and check (measured)", parse_s),
        ("epoch_order + plan_epoch (measured)", times["order_s"] + times["plan_s"]),
        (
            f"first chunk: {len(first_chunk)} GETs at once, largest "
            f"{first_chunk.max() / MB:.1f} MB",
            args.ttfb_s + float(first_chunk.max()) / stream,
        ),
        (f"decode {args.batch_size} images at the target rate", args.batch_size / args.rate),
    ]


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--samples", type=int, default=2_000_000)
    parser.add_argument("--dataset-gb", type=float, default=200.0)
    parser.add_argument("--shard-bytes", type=int, default=DEFAULT_SHARD_BYTES)
    parser.add_argument("--nodes", type=int, default=64)
    parser.add_argument("--ranks-per-node", type=int, default=8)
    parser.add_argument("--rate", type=float, default=3000.0, help="images/s per rank")
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--prefix-limit", type=float, default=5500.0, help="GET/s per prefix")
    parser.add_argument("--link-gbit", type=float, default=25.0, help="one node's link")
    parser.add_argument("--cache-gb", default="1,4,16,64,256", help="disk cache sizes per node")
    parser.add_argument("--prefixes", default="1,4,16,32,64", help="layouts to tabulate")
    parser.add_argument("--ttfb-s", type=float, default=0.03, help="first-byte latency")
    parser.add_argument("--stream-mb-per-s", type=float, default=100.0, help="one GET's speed")
    parser.add_argument("--bin-s", type=float, default=0.1, help="time bin for peak rates")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--model-nodes",
        type=int,
        default=0,
        help="model the ranks of this many nodes, spread evenly, node 0 first, and scale "
        "request counts to all nodes (default: every node)",
    )
    args = parser.parse_args()
    count = min(args.model_nodes or args.nodes, args.nodes)
    args.modelled = sorted({round(float(n)) for n in np.linspace(0, args.nodes - 1, count)})
    OUT.mkdir(parents=True, exist_ok=True)
    wall = time.perf_counter()

    data = make_dataset(args)
    index = index_of(data)
    shards = len(data["shard_sizes"])
    mean_span = float(data["span"].mean())
    config = resolve_order(None, seed=args.seed, units=args.samples, unit_bytes=mean_span)
    reads0, times = epoch_reads(data, index, config, 0, args)
    reads1, _ = epoch_reads(data, index, config, 1, args)
    world_size = args.nodes * args.ranks_per_node
    epoch_s = -(-args.samples // world_size) / args.rate
    blocks = int(np.ceil(data["shard_sizes"] / config.block_size).sum())
    gets = len(reads0["t"]) * args.nodes / len(args.modelled)

    needed = prefixes_needed(reads0, shards, args)
    layouts = sorted({int(p) for p in args.prefixes.split(",")} | {needed})
    rates = [prefix_rates(reads0, shards, p, epoch_s, args) for p in layouts]
    pages0 = {n: node_pages(reads0, n) for n in args.modelled}
    pages1 = {n: node_pages(reads1, n)[0] for n in args.modelled}
    load = node_load(reads0, pages0, epoch_s, mean_span, args)
    caches = []
    for gb in (float(g) for g in args.cache_gb.split(",")):
        hits = [cache_hits(pages0[n][0], pages1[n], gb * 1e9) for n in args.modelled]
        caches.append(
            {
                "cache_gb": gb,
                "epoch2_hit_rate": float(np.mean([h["hit_rate"] for h in hits])),
                "epoch2_hits_from_epoch1": float(np.mean([h["from_epoch1"] for h in hits])),
            }
        )
    steps = first_batch(index, reads0, times, args)

    result = {
        "python": platform.python_version(),
        "inputs": dict(vars(args)),
        "dataset": {
            "samples": args.samples,
            "bytes": int(data["span"].sum()),
            "shards": shards,
            "mean_span_bytes": mean_span,
            "block_size": config.block_size,
            "group_blocks": config.group_blocks,
            "blocks": blocks,
        },
        "epoch_s": epoch_s,
        "gets_per_epoch": round(gets),
        "gets_per_block": gets / blocks,
        "prefix_rates": rates,
        "prefixes_needed": needed,
        "prefixes_needed_by_mean": int(np.ceil(gets / epoch_s / args.prefix_limit)),
        "node_load": load,
        "link_suffices": {k: v["mean_link_share"] <= 1.0 for k, v in load.items()},
        "cache": caches,
        "first_batch": {"steps": steps, "total_s": sum(s for _, s in steps)},
        "model_seconds": time.perf_counter() - wall,
    }
    (OUT / "scale.json").write_text(json.dumps(result, indent=1), encoding="utf-8")
    text = render(result, args)
    (OUT / "scale.md").write_text(text, encoding="utf-8")
    print(text)
    return 0


def render(result: dict[str, Any], args: argparse.Namespace) -> str:
    """The Markdown tables of docs/scale.md."""
    d = result["dataset"]
    world = args.nodes * args.ranks_per_node
    limit = args.prefix_limit
    lines = [
        f"{d['samples']:,} samples, {d['bytes'] / 1e9:.0f} GB in {d['shards']:,} shards of "
        f"{args.shard_bytes / 1e6:.0f} MB; {args.nodes} nodes x {args.ranks_per_node} ranks "
        f"at {args.rate:,.0f} images/s each ({world * args.rate / 1e6:.2f} M images/s): an "
        f"epoch lasts {result['epoch_s']:.2f} s. Blocks of {d['block_size']} samples, groups "
        f"of {d['group_blocks']} blocks: {d['blocks']:,} blocks, read with "
        f"{result['gets_per_epoch']:,} GETs ({result['gets_per_block']:.2f} per block). "
        f"Peaks are the busiest {args.bin_s:g} s bin. "
        + (
            "Every rank of every node modelled."
            if len(args.modelled) == args.nodes
            else f"The ranks of {len(args.modelled)} nodes modelled, request counts scaled."
        ),
        "",
        f"| prefixes | busiest prefix, peak GET/s | mean GET/s per prefix | under {limit:,.0f}/s |",
        "| ---: | ---: | ---: | :---: |",
    ]
    for row in result["prefix_rates"]:
        ok = "yes" if row["peak_get_per_s"] <= limit else "no"
        lines.append(
            f"| {row['prefixes']} | {row['peak_get_per_s']:,.0f} | "
            f"{row['mean_get_per_s']:,.0f} | {ok} |"
        )
    lines += [
        "",
        f"Prefixes needed: **{result['prefixes_needed']}** "
        f"for every {args.bin_s:g} s bin ({result['prefixes_needed_by_mean']} for the mean rate "
        "over the epoch).",
        "",
        f"| per node | mean MB/s | share of {args.link_gbit:g} Gbit/s | peak MB/s | peak share |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    labels = {
        "delivered": "sample bytes the ranks consume",
        "direct": "ranged GETs, no disk cache",
        "paged": "through the disk cache, epoch 1 (1 MiB pages)",
    }
    for name in ("delivered", "direct", "paged"):
        row = result["node_load"][name]
        lines.append(
            f"| {labels[name]} | {row['mean_mb_per_s']:,.0f} | {row['mean_link_share']:.0%} | "
            f"{row['peak_mb_per_s']:,.0f} | {row['peak_link_share']:.0%} |"
        )
    fits = result["link_suffices"]
    lines += [
        "",
        f"One node's link carries the epoch's mean load: for the ranged GETs "
        f"**{'yes' if fits['direct'] else 'no'}**; through the disk cache "
        f"**{'yes' if fits['paged'] else 'no'}**. (A peak counts all of a chunk's "
        "requests at the instant its rank reaches it; a run spreads them over its prefetch.)",
        "",
        "| disk cache per node | epoch 2 hit rate (page reads) | of which pages from epoch 1 |",
        "| ---: | ---: | ---: |",
    ]
    for row in result["cache"]:
        lines.append(
            f"| {row['cache_gb']:g} GB | {row['epoch2_hit_rate']:.1%} | "
            f"{row['epoch2_hits_from_epoch1']:.1%} |"
        )
    lines += ["", "| first batch, rank 0 | seconds |", "| --- | ---: |"]
    for step, seconds in result["first_batch"]["steps"]:
        lines.append(f"| {step} | {seconds:.3f} |")
    lines.append(f"| **total** | **{result['first_batch']['total_s']:.2f}** |")
    lines += ["", f"Model ran in {result['model_seconds']:.1f} s."]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
