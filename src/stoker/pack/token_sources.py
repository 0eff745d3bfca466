"""Inputs of ``stoker pack --tokens``: tokenized documents, or text for a tokenizer.

The input is told by its names (:func:`find_token_inputs`):

- ``.npy`` and ``.bin`` files, one document each (a folder, local or in a bucket): a
  ``.npy`` file's header is read without numpy's pickle support (an array of Python objects
  is refused) and must describe a one-dimensional integer array; a ``.bin`` file is raw ids
  of the dtype given (``bin_dtype``). A document's key is the file's path under the folder
  without its extension, made a valid key (:func:`document_key`).
- one ``.npy`` (or ``.bin``) file of concatenated tokens with an offsets array (each
  document's start, and the end): the documents are its slices.
- ``.jsonl`` files (one JSON object a line, the text in ``text_field``) or ``.parquet``
  files (the text in the column ``text_field``): each line or row is a document, keyed by
  the file's path without extension, ``_`` and its line (from 1) or row (from 0) number
  (read by :mod:`stoker.pack.token_text`).

Every reader yields :class:`Item` in a fixed order; a bad document is an item with a
``problem`` (skipped or raised by the caller), a bad input as a whole (a missing column,
offsets that do not fit the tokens) raises.
"""

from __future__ import annotations

import hashlib
import logging
import re
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, cast

import numpy as np

from stoker.errors import SourceError
from stoker.format.foreign.locations import LocationReader, is_remote
from stoker.format.foreign.walk import hidden, say_left_out, walk_local
from stoker.format.records import decode_npy, read_npy_header
from stoker.format.spec import ARRAYS_NAME, MANIFEST_NAME, check_key
from stoker.storage import open_store
from stoker.storage.base import key_problem

logger = logging.getLogger(__name__)

TokenInputKind = Literal["documents", "concatenated", "jsonl", "parquet"]

#: Raw ``.bin`` dtypes, by the names ``--bin-dtype`` takes (little-endian).
BIN_DTYPES = ("uint8", "uint16", "uint32", "uint64", "int8", "int16", "int32", "int64")
_DOCUMENTS = (".npy", ".bin")
_JSONL = (".jsonl", ".ndjson")
_PARQUET = (".parquet",)


@dataclass(frozen=True, slots=True)
class InputFile:
    """One input file: its location, its path under the input folder, its size."""

    location: str
    relative: str
    size: int


@dataclass(frozen=True, slots=True)
class TokenInputs:
    """What :func:`find_token_inputs` found: the kind of input and its files, in order."""

    kind: TokenInputKind
    files: list[InputFile]
    ignored: int = 0

    @property
    def bytes(self) -> int:
        """Input bytes."""
        return sum(f.size for f in self.files)


@dataclass(frozen=True, slots=True)
class Item:
    """One document read: tokens (or text to tokenize), or the reason it is bad."""

    key: str
    source: str
    value: np.ndarray | str | None = None
    problem: str | None = None


def find_token_inputs(
    location: str,
    *,
    offsets: str | None = None,
    storage_options: Mapping[str, Any] | None = None,
) -> TokenInputs:
    """List the input at ``location`` (a file, or a folder or bucket prefix) and tell its
    kind from the names: ``.npy``/``.bin`` documents, JSONL or Parquet text; one ``.npy`` or
    ``.bin`` file with ``offsets`` is concatenated documents. Hidden files (a ``.`` or ``_``
    name, stoker's own index) are left out, other names are ignored and counted.

    Raises:
        ValueError: Nothing to pack, or inputs of more than one kind (named).
    """
    files = _list(location, storage_options)
    wanted = (*_DOCUMENTS, *_JSONL, *_PARQUET)
    kept = [f for f in files if f.relative.lower().endswith(wanted)]
    if not kept:
        shown = ", ".join(f.relative for f in files[:5]) or "no files"
        raise ValueError(
            f"{location}: no .npy or .bin documents, .jsonl or .parquet text to pack as "
            f"tokens (found {shown})"
        )
    kinds = {_kind_of(f.relative) for f in kept}
    if len(kinds) > 1:
        raise ValueError(
            f"{location}: holds inputs of more than one kind ({', '.join(sorted(kinds))}); "
            "pack each kind on its own"
        )
    kind: TokenInputKind = kinds.pop()
    if offsets is not None:
        if kind != "documents" or len(kept) != 1:
            raise ValueError(
                f"{location}: offsets go with one .npy or .bin file of concatenated tokens, "
                f"not {len(kept)} {kind} files"
            )
        kind = "concatenated"
    elif kind == "documents" and _looks_concatenated(location, kept):
        raise ValueError(
            f"{location}: one token file; give its documents' offsets (--offsets FILE.npy) "
            "to pack it as concatenated documents, or put it in a folder to pack it as one"
        )
    return TokenInputs(kind, kept, ignored=len(files) - len(kept))


def _looks_concatenated(location: str, kept: list[InputFile]) -> bool:
    return len(kept) == 1 and location.rstrip("/").lower().endswith(_DOCUMENTS)


def _kind_of(name: str) -> TokenInputKind:
    lower = name.lower()
    if lower.endswith(_JSONL):
        return "jsonl"
    if lower.endswith(_PARQUET):
        return "parquet"
    return "documents"


def _list(location: str, storage_options: Mapping[str, Any] | None) -> list[InputFile]:
    if not is_remote(location):
        root = Path(location.removeprefix("file://"))
        if root.is_file():
            return [InputFile(str(root), root.name, root.stat().st_size)]
        if not root.is_dir():
            raise ValueError(f"{location}: no such file or directory")
        left_out: list[str] = []
        found = [
            InputFile(str(path), relative, path.stat().st_size)
            for path, relative in walk_local(root, left_out)
        ]
        say_left_out(logger, location, left_out)
        return _without_index(found)
    store = open_store(location, storage_options=storage_options)
    listed, left_out = [], []
    for meta in store.list(""):
        if hidden(meta.key):
            left_out.append(meta.key)
        else:
            listed.append(InputFile(f"{store.url.rstrip('/')}/{meta.key}", meta.key, meta.size))
    say_left_out(logger, location, left_out)
    if not listed:  # perhaps the URL names one object
        parent, _, name = location.rstrip("/").rpartition("/")
        try:
            meta = open_store(parent, storage_options=storage_options).head(name)
        except (FileNotFoundError, ValueError):
            return []
        return [InputFile(location.rstrip("/"), name, meta.size)]
    return _without_index(sorted(listed, key=lambda f: f.relative))


def _without_index(files: list[InputFile]) -> list[InputFile]:
    # stoker's own index.bin beside its index.json is no document.
    names = {f.relative for f in files}
    if MANIFEST_NAME in names:
        return [f for f in files if f.relative not in (MANIFEST_NAME, ARRAYS_NAME)]
    return files


def document_key(relative: str, suffix: str = "") -> str:
    """A valid sample key (:func:`~stoker.format.spec.check_key`) for the input at
    ``relative`` (its extension dropped, dots and unsafe characters made ``_``, empty
    segments dropped), with ``suffix`` appended; one over 200 bytes is cut and given a
    hash of the whole, so that keys stay distinct."""
    stem = relative.rsplit(".", 1)[0] if "." in relative.rsplit("/", 1)[-1] else relative
    parts = [re.sub(r"[.\\\x00-\x1f\x7f:]", "_", p) for p in stem.split("/") if p]
    key = "/".join(parts) + suffix or "_"
    if len(key.encode("utf-8")) > 200:
        digest = hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()[:16]
        key = key.encode("utf-8")[:160].decode("utf-8", "ignore").rstrip("/") + "_" + digest
    check_key(key)
    return key


def read_documents(
    files: list[InputFile],
    reader: LocationReader,
    *,
    bin_dtype: str | None,
    workers: int,
) -> Iterator[Item]:
    """One item per ``.npy``/``.bin`` file, in listing order, ``workers`` reads in flight.

    Raises:
        ValueError: ``.bin`` files and no ``bin_dtype``, or two files with one key.
    """
    if bin_dtype is None and any(f.relative.lower().endswith(".bin") for f in files):
        raise ValueError(
            "raw .bin token files carry no dtype: give it (--bin-dtype uint16, uint32, ...)"
        )
    dtype = _bin_dtype(bin_dtype)
    keys: dict[str, str] = {}
    for f in files:
        key = document_key(f.relative)
        if key in keys:
            raise ValueError(
                f"{keys[key]} and {f.location} both make the document key {key!r}; rename one"
            )
        keys[key] = f.location

    def load(f: InputFile) -> Item:
        key = document_key(f.relative)
        problem = key_problem(f.relative)
        if problem is not None:
            return Item(key, f.location, problem=f"unusable name: {problem}")
        try:
            data = reader.read(f.location)
            return Item(key, f.location, decode_document(data, f.relative, dtype))
        except (SourceError, ValueError) as exc:
            return Item(key, f.location, problem=str(exc))

    if files and is_remote(files[0].location):
        reader.store_for(files[0].location)  # opened once, before the threads race to it
    yield from ordered_map(load, files, workers=workers)


def _bin_dtype(name: str | None) -> np.dtype[Any] | None:
    if name is None:
        return None
    if name not in BIN_DTYPES:
        raise ValueError(f"bin dtype {name!r} is not one of {list(BIN_DTYPES)}")
    return np.dtype(name).newbyteorder("<")


def decode_document(data: bytes, name: str, bin_dtype: np.dtype[Any] | None) -> np.ndarray:
    """The token ids of one ``.npy`` or ``.bin`` file's bytes (never unpickled).

    Raises:
        ValueError: Not an npy array, not one-dimensional, not integers, or a ``.bin`` of
            a length that is not a whole number of ids.
    """
    if name.lower().endswith(".bin"):
        if bin_dtype is None:
            raise ValueError("a .bin file needs a dtype")
        if len(data) % bin_dtype.itemsize:
            raise ValueError(f"{len(data)} bytes, not a whole number of {bin_dtype.name} ids")
        return np.frombuffer(data, dtype=bin_dtype)
    layout = read_npy_header(data)
    if layout.dtype.hasobject:
        raise ValueError("an npy array of Python objects (never unpickled), expected token ids")
    _check_array_form(layout.shape, layout.dtype)
    return cast(np.ndarray, decode_npy(data))  # objects refused above


def _check_array_form(shape: tuple[int, ...], dtype: np.dtype[Any]) -> None:
    if len(shape) != 1:
        raise ValueError(f"a {len(shape)}-D array of shape {shape}, expected one dimension")
    if dtype.kind not in "iu":
        raise ValueError(f"an array of {dtype}, expected integer token ids")


def read_concatenated(
    tokens: InputFile, offsets: str, reader: LocationReader, *, bin_dtype: str | None
) -> Iterator[Item]:
    """The documents of one file of concatenated tokens, cut at ``offsets`` (a ``.npy``
    of each document's start and the end; local files are memory-mapped, objects read
    whole).

    Raises:
        ValueError: Offsets that are no 1-D integer array, do not start at 0, go down, or
            do not end at the tokens' end; a tokens file that is no 1-D integer array.
    """
    stream = _load_stream(tokens, reader, _bin_dtype(bin_dtype))
    cuts = decode_npy(reader.read(offsets))
    if not isinstance(cuts, np.ndarray) or cuts.ndim != 1 or cuts.dtype.kind not in "iu":
        raise ValueError(f"{offsets}: expected a 1-D integer array of document offsets")
    cuts = cuts.astype(np.int64)
    if len(cuts) < 2 or cuts[0] != 0 or cuts[-1] != len(stream):
        raise ValueError(
            f"{offsets}: offsets must be each document's start and the end, from 0 to the "
            f"{len(stream)} tokens of {tokens.location}; found {len(cuts)} offsets "
            + (f"from {cuts[0]} to {cuts[-1]}" if len(cuts) else "")
        )
    down = np.flatnonzero(np.diff(cuts) < 0)
    if len(down):
        n = int(down[0])
        raise ValueError(f"{offsets}: offset {n + 1} ({cuts[n + 1]}) is below offset {n}")
    width = max(8, len(str(len(cuts) - 2)))
    for n in range(len(cuts) - 1):
        start, end = int(cuts[n]), int(cuts[n + 1])
        key = document_key(tokens.relative, f"_{n:0{width}d}")
        yield Item(key, f"{tokens.location} document {n} (tokens {start}:{end})", stream[start:end])


def _load_stream(f: InputFile, reader: LocationReader, dtype: np.dtype[Any] | None) -> np.ndarray:
    local = not is_remote(f.location)
    path = f.location.removeprefix("file://")
    if f.relative.lower().endswith(".bin"):
        if dtype is None:
            raise ValueError(f"{f.location}: raw tokens carry no dtype: give it (--bin-dtype)")
        if f.size % dtype.itemsize:
            raise ValueError(f"{f.location}: {f.size} bytes, not a whole number of {dtype} ids")
        if local:
            return np.memmap(path, dtype=dtype, mode="r") if f.size else np.zeros(0, dtype)
        return np.frombuffer(reader.read(f.location), dtype=dtype)
    array: np.ndarray
    try:
        if local:
            array = np.lib.format.open_memmap(path, mode="r")
        else:
            data = reader.read(f.location)
            if read_npy_header(data).dtype.hasobject:
                raise ValueError("an npy array of Python objects (never unpickled)")
            array = cast(np.ndarray, decode_npy(data))  # objects refused above
        _check_array_form(array.shape, array.dtype)
    except ValueError as exc:
        raise ValueError(f"{f.location}: {exc}") from None
    return array


def ordered_map(
    function: Callable[[InputFile], Item], items: Iterable[InputFile], *, workers: int
) -> Iterator[Item]:
    """``map(function, items)`` with ``workers`` calls in flight on threads, in order."""
    with ThreadPoolExecutor(workers, thread_name_prefix="stoker-pack-tokens") as pool:
        pending: deque[Future[Item]] = deque()
        for item in items:
            pending.append(pool.submit(function, item))
            if len(pending) >= 2 * workers:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()
