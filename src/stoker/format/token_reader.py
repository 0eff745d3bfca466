"""Reading runs of a token dataset's stream (see :mod:`stoker.format.tokens`)."""

from __future__ import annotations

import asyncio
import zlib

import numpy as np

from stoker.errors import CorruptShardError
from stoker.format.reader import ShardDataset
from stoker.format.tokens import TokenLayout, document_starts


class TokenReader:
    """Runs of tokens of a packed token dataset, each one ranged GET per shard it touches.

    Every document that lies wholly inside a run is checked against its CRC-32 in the index
    (runs of megabytes hold hundreds of documents; the few cut at a run's ends are checked
    by the runs that hold them whole, and ``stoker verify`` checks every shard's SHA-256),
    and the first read of each shard checks its size, so a replaced or truncated shard is
    refused rather than read as tokens.

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
        ranges = self.layout.ranges(start, stop)
        shards = self.dataset.shards
        store = self.dataset.store
        data, _ = await asyncio.gather(
            asyncio.gather(
                *(store.get_range_async(shards[s].name, start=a, end=b) for s, a, b in ranges)
            ),
            asyncio.gather(*(self.dataset.check_size_async(s) for s, _, _ in ranges)),
        )
        joined = data[0] if len(data) == 1 else memoryview(b"".join(data))
        self._check_documents(joined, start, stop)
        return np.frombuffer(joined, dtype=self.layout.dtype)

    def _check_documents(self, data: memoryview, start: int, stop: int) -> None:
        starts = self.doc_starts
        first = int(np.searchsorted(starts, start, side="left"))
        last = int(np.searchsorted(starts, stop, side="right")) - 1  # docs [first, last) whole
        if last <= first:
            return
        item = self.layout.itemsize
        index = self.dataset.index
        bounds = ((starts[first : last + 1] - start) * item).tolist()
        crcs = index.crc32[first:last].tolist()
        view = memoryview(data)
        for n, expected in enumerate(crcs):
            if zlib.crc32(view[bounds[n] : bounds[n + 1]]) != expected:
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
