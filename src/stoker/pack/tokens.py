"""pack_tokens(): tokenized documents, or text and a tokenizer, into a token dataset.

The inputs (:mod:`stoker.pack.token_sources`) are read once, in order, and each document
is checked (one-dimensional integer ids, not empty, each below the vocabulary size, or
fitting 32 bits when none is known) and appended to a staging file in the temporary
directory (``tempfile``; 2 or 4 bytes a token, removed at the end). Staging gives the
largest id before the dtype is chosen and lets the documents be written in a seeded
shuffled order (as image packs are), whatever the input: the dataset is ``uint16`` when
the vocabulary size (given, or the tokenizer's) fits it, or, with no vocabulary size
known, when the largest id found does; else ``uint32``. Then the shards are written one
by one, each followed by its record in ``_stoker/`` and, last, the index (the commit
point), under the destination rule of every pack (:mod:`stoker.pack.resume`): a rerun of
an interrupted pack, with the same input and arguments, writes only the shards it lacks.
"""

from __future__ import annotations

import json
import logging
import os
import random
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from typing import Any, Literal

import numpy as np

from stoker.format.foreign.locations import LocationReader
from stoker.format.spec import PACK_STATE_DIR, shard_name
from stoker.format.token_writer import (
    TokenShard,
    group_documents,
    write_token_index,
    write_token_shard,
)
from stoker.format.tokens import TOKEN_LIMITS, token_dtype
from stoker.format.writer import SampleRecord, ShardRecord
from stoker.pack.config import DEFAULT_SHARD_BYTES
from stoker.pack.plan import PackPlan, plan_ids
from stoker.pack.report import PackProgress, PackReport, TokenStats
from stoker.pack.resume import check_shards_present, refuse_foreign, resume_state
from stoker.pack.sources import refuse_destination_in_source
from stoker.pack.token_sources import (
    BIN_DTYPES,
    Item,
    TokenInputs,
    find_token_inputs,
    read_concatenated,
    read_documents,
)
from stoker.pack.token_staging import Staging
from stoker.pack.token_summary import TokenSummary, summarise_tokens
from stoker.pack.token_text import read_jsonl, read_parquet
from stoker.pack.tokenizers import TOKENIZE_BATCH, Tokenizer, load_tokenizer, tokenized
from stoker.storage import Store, open_store

logger = logging.getLogger(__name__)

# Importable from here as before: the tokenizers (stoker.pack.tokenizers) and the summary
# of a packed dataset (stoker.pack.token_summary).
__all__ = [
    "TOKENIZE_BATCH",
    "TokenPackConfig",
    "TokenPackReport",
    "TokenSummary",
    "Tokenizer",
    "load_tokenizer",
    "pack_tokens",
    "summarise_tokens",
]

_UINT32_MAX = TOKEN_LIMITS["uint32"]


@dataclass(frozen=True, slots=True, kw_only=True)
class TokenPackConfig:
    """How to pack tokens.

    Attributes:
        eos_id: The end-of-text id appended after every document, if any.
        vocab_size: Ids at or above it are out of range; it also sets the dtype (``uint16``
            up to 65,536). A ``tokenizers`` file gives its own when this is None.
        bin_dtype: The dtype of raw ``.bin`` inputs (``uint16``, ``uint32``, ``int32``, ...).
        text_field: The JSONL field or Parquet column holding the text.
        max_shard_bytes: Target shard size: a shard is closed at the first document
            boundary past this many token bytes.
        shuffle_seed: Write the documents in the random order of this seed (recorded in
            the index); None keeps the input's order.
        on_error: ``"raise"`` stops at the first bad document, naming it; ``"skip"`` leaves
            it out and lists it, with the reason, in the index and the report.
        workers: Input files read at once (for a folder of documents in a bucket).
    """

    eos_id: int | None = None
    vocab_size: int | None = None
    bin_dtype: str | None = None
    text_field: str = "text"
    max_shard_bytes: int = DEFAULT_SHARD_BYTES
    shuffle_seed: int | None = 0
    on_error: Literal["raise", "skip"] = "raise"
    workers: int = 32

    def __post_init__(self) -> None:
        for name in ("eos_id", "vocab_size", "shuffle_seed", "max_shard_bytes", "workers"):
            value = getattr(self, name)
            # True is an int to Python, but not an id: it packed a dataset nothing could open.
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
                raise TypeError(f"{name} must be an int, got {value!r}")
        if self.vocab_size is not None and not 1 <= self.vocab_size <= _UINT32_MAX + 1:
            raise ValueError(f"vocab_size must be between 1 and 2**32, got {self.vocab_size}")
        if self.eos_id is not None and not 0 <= self.eos_id <= _UINT32_MAX:
            raise ValueError(f"eos_id must be between 0 and 2**32 - 1, got {self.eos_id}")
        if self.bin_dtype is not None and self.bin_dtype not in BIN_DTYPES:
            raise ValueError(f"bin_dtype must be one of {list(BIN_DTYPES)}, got {self.bin_dtype!r}")
        if self.max_shard_bytes < 1 or self.workers < 1:
            raise ValueError("max_shard_bytes and workers must be >= 1")
        if self.on_error not in ("raise", "skip"):
            raise ValueError(f"on_error must be 'raise' or 'skip', got {self.on_error!r}")


#: The report of a token pack: the report of every pack (its ``tokens`` holds the token
#: counts, dtype and ids).
TokenPackReport = PackReport


def pack_tokens(
    source: str | os.PathLike[str],
    destination: str | os.PathLike[str],
    *,
    config: TokenPackConfig | None = None,
    tokenizer: Tokenizer | str | os.PathLike[str] | None = None,
    offsets: str | os.PathLike[str] | None = None,
    storage_options: Mapping[str, Any] | None = None,
    progress: PackProgress | None = None,
) -> PackReport:
    """Pack tokenized documents, or text with a tokenizer, into a token dataset.

    The destination follows the rule of every pack: empty, or holding a pack of the same
    input and arguments, which this run resumes (writing only the shards it lacks, then
    the index); anything else there is refused, named, before the input is read.

    Args:
        source: A folder (local or bucket) of ``.npy``/``.bin`` documents, one file of
            concatenated tokens (with ``offsets``), or JSONL or Parquet text (a file or a
            folder of them); see :mod:`stoker.pack.token_sources`.
        destination: Where the dataset goes.
        config: End-of-text id, vocabulary size, shard size, order, error policy.
        tokenizer: For text: a function of one text returning its ids, or a Hugging Face
            ``tokenizers`` JSON file (``pip install 'stoker[tokenizers]'``).
        offsets: A ``.npy`` of each document's start in ``source``, and the end.
        storage_options: For source and destination (see :func:`stoker.open_store`).
        progress: Called as ``progress(total, documents, nbytes)`` as documents are read
            and checked (see :data:`~stoker.pack.report.PackProgress`); ``total`` is None
            while unknown (text, concatenated tokens).

    Returns:
        What was packed; its ``tokens`` holds the token counts, dtype and ids.

    Raises:
        SourceError: A bad document with ``on_error="raise"``: names it and the reason (an
            id out of range, an empty document, not a 1-D integer array).
        StokerError: The destination holds a pack of other input or arguments (the
            message names the arguments that differ).
        ValueError: The destination inside the source folder or holding anything but a
            pack of the same input and arguments; input of mixed kinds or none; text and
            no tokenizer; bad offsets.
        ImportError: A tokenizer file and no ``tokenizers``, or Parquet and no pyarrow.
    """
    config = config or TokenPackConfig()
    started = time.perf_counter()
    src, dst = os.fspath(source), os.fspath(destination)
    refuse_destination_in_source(src, dst)
    store = open_store(dst, storage_options=storage_options)
    offsets_at = None if offsets is None else os.fspath(offsets)
    inputs = find_token_inputs(src, offsets=offsets_at, storage_options=storage_options)
    encoder = _encoder(inputs, src, tokenizer, storage_options)
    vocab_size = config.vocab_size or (encoder.vocab_size if encoder else None)
    packed_with = _packed_with(inputs, src, encoder, vocab_size, config)
    plan = _plan(inputs, offsets_at, packed_with)
    refuse_foreign(store, plan, packed_with["source"])
    report = PackReport(
        source=packed_with["source"], source_format=inputs.kind, destination=store.url
    )
    report.bytes_in, reader = inputs.bytes, LocationReader(storage_options)
    limit = _UINT32_MAX if vocab_size is None else vocab_size - 1
    items = _read(inputs, reader, config, offsets_at)
    items = tokenized(items, encoder) if encoder is not None else items
    with Staging(token_dtype(limit)) as staging:
        staging.fill(
            items,
            limit=limit,
            vocab_size=vocab_size,
            on_error=config.on_error,
            skipped=report.skipped,
            progress=progress,
            total=len(inputs.files) if inputs.kind == "documents" else None,
            where=src,
        )
        largest = max(staging.max_id, -1 if config.eos_id is None else config.eos_id)
        dtype = token_dtype(largest if vocab_size is None else vocab_size - 1)
        shards = _write_shards(store, staging, plan, dtype, config, report)
    report.tokens = _commit(store, shards, dtype, packed_with, config, report)
    report.requests = {"source": reader.requests(), "destination": store.counters.snapshot()}
    report.seconds = time.perf_counter() - started
    return report


def _packed_with(
    inputs: TokenInputs, src: str, encoder: Any, vocab_size: int | None, config: TokenPackConfig
) -> dict[str, Any]:
    """What the index records of how the pack was made (refusing an end-of-text id
    outside the vocabulary)."""
    if config.eos_id is not None and vocab_size is not None and config.eos_id >= vocab_size:
        raise ValueError(f"eos id {config.eos_id} is outside the vocabulary of {vocab_size:,}")
    return {
        "source": f"{inputs.kind} {src} ({len(inputs.files):,} files)",
        "format": inputs.kind,
        "tokenizer": encoder.description if encoder else None,
        "text_field": config.text_field if encoder else None,
        "bin_dtype": config.bin_dtype,
        "vocab_size": vocab_size,
        **{name: getattr(config, name) for name in ("eos_id", "max_shard_bytes", "shuffle_seed")},
    }


def _commit(
    store: Store,
    shards: list[TokenShard],
    dtype: np.dtype[Any],
    packed_with: dict[str, Any],
    config: TokenPackConfig,
    report: PackReport,
) -> TokenStats:
    """Check every shard is there, write the index (the commit point), and say what the
    dataset holds."""
    check_shards_present(store, [shard.record for shard in shards])
    index = write_token_index(
        store,
        shards,
        dtype=dtype,
        eos_id=config.eos_id,
        packed_with=packed_with,
        skipped=report.skipped,
    )
    layout = index.tokens
    if layout is None:  # write_token_index always sets it
        raise RuntimeError("write_token_index wrote no tokens section")
    report.samples, report.shards = len(index), len(shards)
    return TokenStats(
        tokens=layout.tokens,
        dtype=layout.dtype.name,
        eos_id=layout.eos_id,
        max_id=layout.max_id,
        tokenizer=packed_with["tokenizer"],
        shuffle_seed=config.shuffle_seed,
    )


def _encoder(
    inputs: TokenInputs,
    src: str,
    tokenizer: Tokenizer | str | os.PathLike[str] | None,
    storage_options: Mapping[str, Any] | None,
) -> Any:
    """The tokenizer text input needs, loaded; None for tokens (refusing a tokenizer)."""
    text = inputs.kind in ("jsonl", "parquet")
    if text != (tokenizer is not None):
        raise ValueError(
            f"{src}: {inputs.kind} input needs a tokenizer"
            if text
            else f"{src}: already tokens ({inputs.kind}); a tokenizer applies to text only"
        )
    return load_tokenizer(tokenizer, storage_options=storage_options) if text else None  # type: ignore[arg-type]


def _plan(inputs: TokenInputs, offsets: str | None, packed_with: dict[str, Any]) -> PackPlan:
    """The pack's plan before its input is read: its id (the input files, their sizes and
    the arguments); its shards are cut once the documents are staged."""
    settings = {name: value for name, value in packed_with.items() if name != "source"}
    listing = [f"offsets\0{offsets}"] + [
        f"{f.relative}\0{f.location}\0{f.size}" for f in inputs.files
    ]
    plan_id, listing_id = plan_ids(settings, listing)
    return PackPlan(shards=[], plan_id=plan_id, settings=settings, listing_id=listing_id)


def _write_shards(
    store: Store,
    staging: Staging,
    plan: PackPlan,
    dtype: np.dtype[Any],
    config: TokenPackConfig,
    report: PackReport,
) -> list[TokenShard]:
    """Cut the staged documents, in the pack's order, into shards and write those an
    earlier run of the same plan did not finish, each followed by its record."""
    order = list(range(len(staging.keys)))
    if config.shuffle_seed is not None:
        random.Random(config.shuffle_seed).shuffle(order)
    extra = 0 if config.eos_id is None else 1
    shard_tokens = max(1, config.max_shard_bytes // dtype.itemsize)
    groups = list(group_documents(order, lambda n: staging.length(n) + extra, shard_tokens))
    plan = replace(plan, shards=groups)
    keys = [shard_name(n) for n in range(len(groups))]
    done = resume_state(store, plan, report.source_format, report.source, shard_keys=keys)
    report.shards_reused = len(done)
    shards = []
    for number, group in enumerate(groups):
        if number in done:
            shards.append(_shard_from_json(done[number]))
            continue
        shard = write_token_shard(
            store, number, staging.documents(group), dtype=dtype, eos_id=config.eos_id
        )
        store.put(_state_key(number), _shard_to_json(shard))
        report.bytes_out += shard.record.size
        shards.append(shard)
    return shards


def _state_key(number: int) -> str:
    return f"{PACK_STATE_DIR}/{shard_name(number).removesuffix('.tar')}.json"


def _shard_to_json(shard: TokenShard) -> bytes:
    """A written shard's record: what the index needs of it, for a resumed pack."""
    record = shard.record
    return json.dumps(
        {
            "name": record.name,
            "size": record.size,
            "sha256": record.sha256,
            "samples": [[s.key, s.offset, s.length, s.crc32] for s in record.samples],
            "tokens": shard.tokens,
            "data_offset": shard.data_offset,
            "max_id": shard.max_id,
        }
    ).encode()


def _shard_from_json(data: bytes) -> TokenShard:
    raw = json.loads(data)
    samples = [SampleRecord(k, -1, int(o), int(n), int(c)) for k, o, n, c in raw["samples"]]
    record = ShardRecord(raw["name"], int(raw["size"]), raw["sha256"], samples)
    return TokenShard(record, int(raw["tokens"]), int(raw["data_offset"]), int(raw["max_id"]))


def _read(
    inputs: TokenInputs, reader: LocationReader, config: TokenPackConfig, offsets: str | None
) -> Iterator[Item]:
    if inputs.kind == "documents":
        return read_documents(
            inputs.files, reader, bin_dtype=config.bin_dtype, workers=config.workers
        )
    if inputs.kind == "concatenated" and offsets is not None:
        return read_concatenated(inputs.files[0], offsets, reader, bin_dtype=config.bin_dtype)
    if inputs.kind == "jsonl":
        return read_jsonl(inputs.files, reader, text_field=config.text_field)
    return read_parquet(inputs.files, reader, text_field=config.text_field)
