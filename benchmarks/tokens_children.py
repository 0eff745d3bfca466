"""The methods of ``tokens.py``, each in a process of its own, timed from its start.

    python benchmarks/tokens_children.py stoker URL SEQ_LEN BATCH [CACHE_DIR]
    python benchmarks/tokens_children.py litdata URL SEQ_LEN BATCH WORKERS CACHE_DIR
    python benchmarks/tokens_children.py mosaic URL SEQ_LEN BATCH WORKERS LOCAL_DIR
    python benchmarks/tokens_children.py memmap STREAM_BIN SEQ_LEN BATCH [DTYPE]
    python benchmarks/tokens_children.py write-litdata CORPUS_DIR SEQ_LEN
    python benchmarks/tokens_children.py write-mds CORPUS_DIR SEQ_LEN

A run prints one JSON line: sequences and tokens (of ``input_ids``: ``seq_len`` a
sequence; ``units``) delivered, seconds (from the first ``next()`` to the last batch),
tokens/s over those, CPU seconds over those (this process's threads, and the loader's
worker processes once they are joined), ``first_batch_at``, ``ended_at`` and
``imported_at`` (``time.time()``: the harness counts them from the moment it started the
process), peak RSS. DataLoaders (LitData's, Mosaic's) start their workers with the
platform's default method. Every batch is split into ``input_ids``
(the first ``seq_len`` tokens of each sequence) and ``targets`` (the last ``seq_len``: the
next tokens) of shape ``(batch, seq_len)``, and the first is checked. The store comes from
the ``AWS_*`` variables (stoker, LitData) or ``S3_ENDPOINT_URL`` (Mosaic). Only the
method's own library is imported, so the first batch counts what a user's process would
import.
"""

from __future__ import annotations

import os
import resource
import sys
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

STARTED = time.time()

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import emit, peak_rss_mb  # noqa: E402


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _check(inputs: Any, targets: Any, seq_len: int, batch: int) -> None:
    if tuple(inputs.shape) != (batch, seq_len) or tuple(targets.shape) != (batch, seq_len):
        raise RuntimeError(f"a batch of {tuple(inputs.shape)}, expected {(batch, seq_len)}")
    if (inputs[:, 1:] != targets[:, :-1]).any():
        raise RuntimeError("targets are not the inputs shifted by one")


def _split_rows(rows: Any) -> tuple[Any, Any]:
    """Sequences of ``seq_len + 1`` as ``input_ids`` and ``targets`` (views, no copy)."""
    return rows[:, :-1], rows[:, 1:]


def timed(batches: Iterable[Any], split: Any, seq_len: int, batch: int) -> dict[str, Any]:
    """Run ``batches`` (each made ``(input_ids, targets)`` by ``split``) to its end."""
    cpu_started, children_started = time.process_time(), _children_cpu()
    started = time.perf_counter()
    first_at, sequences = 0.0, 0
    iterator = iter(batches)
    for item in iterator:
        inputs, targets = split(item)
        if not sequences:
            first_at = time.time()
            _check(inputs, targets, seq_len, batch)
        sequences += len(inputs)
    ended_at = time.time()
    del iterator  # a DataLoader joins its workers here, so their CPU time is counted
    seconds = time.perf_counter() - started
    cpu_s = time.process_time() - cpu_started + _children_cpu() - children_started
    return {
        "sequences": sequences,
        "tokens": sequences * seq_len,
        "seconds": seconds,
        "tokens_per_s": sequences * seq_len / seconds,
        "units": sequences * seq_len,
        "cpu_s": cpu_s,
        "first_batch_at": first_at,
        "ended_at": ended_at,
    }


def run_stoker(url: str, seq_len: int, batch: int, cache_dir: str | None) -> dict[str, Any]:
    """stoker's TokenLoader on its defaults, cold; with ``cache_dir``, a disk cache there
    and its second epoch timed (read from the cache)."""
    from stoker.pipeline.config import CacheConfig
    from stoker.pipeline.token_loader import TokenLoader

    imported_at = time.time()
    cache = CacheConfig(dir=cache_dir) if cache_dir else None
    with TokenLoader(url, seq_len=seq_len, batch_size=batch, cache=cache) as loader:
        # Cold, one epoch is measured: its bytes, not the next epoch's start read ahead at
        # its end. Warm, epochs run back to back, each reading its successor's start.
        loader.read_ahead = bool(cache_dir)
        opened_at = time.time()
        first_epoch_s = 0.0
        if cache_dir:
            started = time.perf_counter()
            for _ in loader:
                pass
            first_epoch_s = time.perf_counter() - started
        before = loader.stats().requests

        def split(b: dict[str, Any]) -> tuple[Any, Any]:
            return b["input_ids"], b["targets"]

        result = timed(loader, split, seq_len, batch)
        stats = loader.stats()
        requests = stats.requests
    return {
        **result,
        "prefetch": stats.prefetch,
        "threads": stats.threads,
        "order": str(loader.order_config),
        "stages": {name: [t.seconds, t.calls] for name, t in stats.stages.items()},
        "imported_at": imported_at,
        "opened_at": opened_at,
        "first_epoch_s": first_epoch_s,
        "peak_rss_mb": peak_rss_mb(),
        "own_bytes_read": requests.get("bytes.read", 0) - before.get("bytes.read", 0),
        "own_gets": requests.get("requests.get", 0) - before.get("requests.get", 0),
    }


def _store_options() -> dict[str, Any]:
    return {
        "endpoint_url": os.environ["AWS_ENDPOINT_URL"],
        "aws_access_key_id": os.environ["AWS_ACCESS_KEY_ID"],
        "aws_secret_access_key": os.environ["AWS_SECRET_ACCESS_KEY"],
        "region_name": os.environ["AWS_REGION"],
    }


def run_litdata(url: str, seq_len: int, batch: int, workers: int, cache_dir: str) -> dict[str, Any]:
    """LitData's StreamingDataset with TokensLoader(block_size=seq_len + 1), shuffled, in
    its StreamingDataLoader, as LitGPT's pretraining data modules use it."""
    from litdata import StreamingDataLoader, StreamingDataset, TokensLoader
    from litdata.streaming import downloader

    imported_at = time.time()
    # LitData reads chunks with obstore, whose client refuses plain http unless told, and
    # LitData has no setting for it: the bucket here is on http://127.0.0.1 (a real S3
    # endpoint is https and needs none of this).
    downloader._OBSTORE_CLIENT_OPTIONS = {**downloader._OBSTORE_CLIENT_OPTIONS, "allow_http": True}
    dataset = StreamingDataset(
        input_dir=url,
        item_loader=TokensLoader(block_size=seq_len + 1),
        shuffle=True,
        drop_last=True,
        seed=0,
        cache_dir=cache_dir,
        storage_options=_store_options(),
    )
    loader = StreamingDataLoader(
        dataset, batch_size=batch, num_workers=workers, drop_last=True, pin_memory=False
    )

    result = timed(loader, _split_rows, seq_len, batch)
    return {**result, "imported_at": imported_at, "peak_rss_mb": peak_rss_mb()}


def _stack(samples: list[dict[str, Any]]) -> Any:
    import numpy as np

    return np.stack([s["tokens"] for s in samples])


def run_mosaic(url: str, seq_len: int, batch: int, workers: int, local: str) -> dict[str, Any]:
    """Mosaic Streaming's StreamingDataset over samples of seq_len + 1 tokens (as
    llm-foundry writes concatenated tokens), shuffled, in a torch DataLoader."""
    from streaming import StreamingDataset
    from streaming.base.util import clean_stale_shared_memory
    from torch.utils.data import DataLoader

    imported_at = time.time()
    clean_stale_shared_memory()
    dataset = StreamingDataset(
        remote=url, local=local, shuffle=True, shuffle_seed=0, batch_size=batch
    )
    loader = DataLoader(
        dataset, batch_size=batch, num_workers=workers, collate_fn=_stack, drop_last=True
    )

    result = timed(loader, _split_rows, seq_len, batch)
    return {**result, "imported_at": imported_at, "peak_rss_mb": peak_rss_mb()}


def run_memmap(path: str, seq_len: int, batch: int, dtype: str) -> dict[str, Any]:
    """The numpy loop of nanoGPT-style training scripts: the stream memory-mapped from local
    disk, sequences of seq_len + 1 in a random order, stacked in batches.

    ``dtype="uint16"``: the stacked rows, ``input_ids`` and ``targets`` as views of them
    (no cast). Any other: what a TokenLoader of that dtype delivers, ``input_ids`` and
    ``targets`` as two arrays of it, each one cast of the stacked rows, and ``labels`` a
    copy of ``input_ids`` (nanoGPT's ``get_batch`` casts each row apart, x and y: 2.7x
    slower here, so not the baseline).
    """
    import numpy as np

    imported_at = time.time()
    data = np.memmap(path, dtype=np.uint16, mode="r")
    span = seq_len + 1
    order = np.random.default_rng(0).permutation(len(data) // span)
    starts = order[: len(order) // batch * batch].reshape(-1, batch) * span
    cast = None if dtype == "uint16" else np.dtype(dtype)

    def batches() -> Iterator[Any]:
        for row in starts:
            rows = np.stack([data[s : s + span] for s in row])
            if cast is None:
                yield rows[:, :-1], rows[:, 1:]
            else:
                inputs = rows[:, :-1].astype(cast)
                yield inputs, rows[:, 1:].astype(cast), inputs.copy()

    result = timed(batches(), lambda arrays: arrays[:2], seq_len, batch)
    return {**result, "imported_at": imported_at, "peak_rss_mb": peak_rss_mb(), "dtype": dtype}


def _litdata_documents(span: tuple[int, int], *, corpus: str) -> Iterator[Any]:
    import numpy as np

    bounds = np.load(Path(corpus) / "bounds.npy", mmap_mode="r")
    stream = np.memmap(Path(corpus) / "stream.bin", dtype=np.uint16, mode="r")
    for n in range(*span):
        yield np.array(stream[bounds[n] : bounds[n + 1]])  # the document and its eos


def write_litdata(corpus: str, seq_len: int) -> None:
    """The documents (eos included) through LitData's ``optimize`` with TokensLoader."""
    from functools import partial

    import numpy as np
    from litdata import TokensLoader, optimize

    documents = len(np.load(Path(corpus) / "bounds.npy", mmap_mode="r")) - 1
    step = 2000
    inputs = [(n, min(n + step, documents)) for n in range(0, documents, step)]
    optimize(
        fn=partial(_litdata_documents, corpus=corpus),
        inputs=inputs,
        output_dir=str(Path(corpus) / "litdata"),
        chunk_bytes="64MB",
        item_loader=TokensLoader(),
        num_workers=1,
        reorder_files=False,
        keep_data_ordered=True,
    )


def write_mds(corpus: str, seq_len: int) -> None:
    """The stream cut into samples of ``seq_len + 1`` tokens, through Mosaic's MDSWriter."""
    import numpy as np
    from streaming import MDSWriter

    stream = np.memmap(Path(corpus) / "stream.bin", dtype=np.uint16, mode="r")
    span = seq_len + 1
    columns = {"tokens": f"ndarray:uint16:{span}"}
    with MDSWriter(out=str(Path(corpus) / "mds"), columns=columns, size_limit=64 << 20) as out:
        for start in range(0, len(stream) // span * span, span):
            out.write({"tokens": np.array(stream[start : start + span])})


def warm(method: str) -> None:
    """Import what ``method``'s run imports (its bytecode is then compiled)."""
    if method == "stoker":
        from stoker.pipeline.config import CacheConfig  # noqa: F401
        from stoker.pipeline.token_loader import TokenLoader  # noqa: F401
    elif method == "litdata":
        from litdata import StreamingDataLoader, StreamingDataset, TokensLoader  # noqa: F401
        from litdata.streaming import downloader  # noqa: F401
    elif method == "mosaic":
        from streaming import StreamingDataset  # noqa: F401
        from torch.utils.data import DataLoader  # noqa: F401


def main(argv: list[str]) -> int:
    command, args = argv[0], argv[1:]
    if command == "warm":  # quiet.compiled_interpreters: import a method's modules, exit
        warm(args[0])
        return 0
    if command == "write-litdata":
        write_litdata(args[0], int(args[1]))
        return 0
    if command == "write-mds":
        write_mds(args[0], int(args[1]))
        return 0
    seq_len, batch = int(args[1]), int(args[2])
    if command == "stoker":
        result = run_stoker(args[0], seq_len, batch, args[3] if len(args) > 3 else None)
    elif command == "litdata":
        result = run_litdata(args[0], seq_len, batch, int(args[3]), args[4])
    elif command == "mosaic":
        result = run_mosaic(args[0], seq_len, batch, int(args[3]), args[4])
    elif command == "memmap":
        result = run_memmap(args[0], seq_len, batch, args[3] if len(args) > 3 else "uint16")
    else:
        raise SystemExit(f"unknown command {command!r}")
    result["started_at"] = STARTED
    emit(result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
