"""Reading runs of a token dataset's stream (see :mod:`stoker.format.tokens`)."""

from __future__ import annotations

import asyncio

import numpy as np

from stoker.core.crc import crc32
from stoker.errors import CorruptShardError
from stoker.format.reader import ShardDataset
from stoker.format.tokens import TokenLayout, document_starts


class TokenReader:
    """Runs of tokens of a packed token dataset, each one ranged GET per shard it touches.

    Every token a run returns is checked, on every read: the run is read out to the edges
    of the documents it touches (the first and the last may be cut by the run's ends: a
    4 MB run of documents of a few kB reads about 0.1 % more) and every one of those
    documents is checked against its CRC-32 in the index. The check is end to end, from
    what was packed to what is returned, so it covers the object store, the network and
    the disk cache alike: a cached read takes only the run's bytes from the cache's pages
    (:meth:`~stoker.storage.base.Store.get_parts_async`), without the page's own CRC-32
    over the whole page, which would check the same bytes again. The first read of each
    shard also checks its size, from the read's own answer (no HEAD, see
    :meth:`~stoker.format.reader.ShardDataset.read_parts_async`), so a replaced or
    truncated shard is refused rather than read as tokens (``stoker verify`` checks every
    shard's SHA-256).

    Args:
        dataset: A dataset whose index has a ``tokens`` section.

    Raises:
        ValueError: The dataset is not a token dataset.
    """

    def __init__(self, dataset: ShardDataset) -> None:
        layout = dataset.index.tokens
        if layout is None:
            raise ValueError(
                f"{dataset.url} is not a token dataset (pack tokenized documents with "
                "`stoker pack SRC DST --tokens`)"
            )
        self.dataset = dataset
        self.layout: TokenLayout = layout
        index = dataset.index
        #: Stream position of each document's first token, and the total at the end.
        self.doc_starts = document_starts(layout, index.shard, index.offset, index.length)

    @property
    def tokens(self) -> int:
        """Tokens in the stream."""
        return self.layout.tokens

    def read(self, start: int, stop: int) -> np.ndarray:
        """Tokens ``[start, stop)`` of the stream (see :meth:`read_async`)."""
        return self.dataset.store.engine.run(self.read_async(start, stop))

    async def read_async(self, start: int, stop: int) -> np.ndarray:
        """Tokens ``[start, stop)`` of the stream as a read-only array of the dataset's dtype.

        Raises:
            IndexError: The run is empty or outside the stream.
            CorruptShardError: A shard's size, or a whole document's CRC-32, does not match
                the index (the message names the shard and the document).
        """
        if not 0 <= start < stop <= self.layout.tokens:
            raise IndexError(f"tokens [{start}, {stop}) outside the stream of {self.tokens}")
        starts = self.doc_starts
        # The documents that [start, stop) touches, whole: [outer_start, outer_stop).
        first = int(np.searchsorted(starts, start, side="right")) - 1
        last = int(np.searchsorted(starts, stop, side="left"))
        outer_start, outer_stop = int(starts[first]), int(starts[last])
        ranges = self.layout.ranges(outer_start, outer_stop)
        read = self.dataset.read_parts_async
        data = await asyncio.gather(
            *(read(s, start=a, end=b, parts=[(a, b)]) for s, a, b in ranges)
        )
        joined = data[0][0] if len(data) == 1 else memoryview(b"".join(p[0] for p in data))
        self._check_documents(joined, first, last)
        tokens = np.frombuffer(joined, dtype=self.layout.dtype)
        return tokens[start - outer_start : stop - outer_start]

    def _check_documents(self, data: memoryview, first: int, last: int) -> None:
        """Check documents ``[first, last)``, which ``data`` holds whole and in order."""
        starts = self.doc_starts
        item = self.layout.itemsize
        index = self.dataset.index
        bounds = ((starts[first : last + 1] - starts[first]) * item).tolist()
        view = memoryview(data)
        found = map(crc32, map(view.__getitem__, map(slice, bounds[:-1], bounds[1:])))
        for n, (crc, expected) in enumerate(
            zip(found, index.crc32[first:last].tolist(), strict=True)
        ):
            if crc != expected:
                doc = first + n
                shard = index.shards[int(index.shard[doc])].name
                raise CorruptShardError(
                    f"{self.dataset.url}/{shard}: document {index.keys[doc]!r} "
                    f"(#{doc}) fails its CRC-32 check"
                )

    def document_lengths(self, start: int, stop: int) -> np.ndarray:
        """Lengths of the pieces of documents that make up tokens ``[start, stop)``, in order
        (the first and last may be parts of documents cut by the run's ends)."""
        starts = self.doc_starts
        inner = starts[(starts > start) & (starts < stop)]
        edges = np.concatenate([[start], inner, [stop]]).astype(np.int64)
        return np.diff(edges)
