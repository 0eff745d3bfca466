"""What every foreign reader provides: cheap references first, then bytes on demand.

Packing is planned before anything is read: a reader lists its input as :class:`SampleRef`
objects (where a sample lives and about how many bytes it has), the planner cuts that list
into shards, and the workers that write the shards call :meth:`SampleReader.read` for each
reference. So a reader must be able to read any reference on its own, in any order, from
any process: references are plain picklable data, and a reader opens its stores lazily.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    from stoker.format.video import VideoIndex


def sample_key(relative: str) -> str:
    """The key of a sample stored as one file: its path relative to the dataset's root
    (the image folder, the list file's folder) without its extension, the dots left in the
    file's name made ``_``.

    The one rule for such samples, however they are stored: streamed unpacked, packed from
    the folder, or packed from a CSV/JSONL list naming the same files
    (``astronaut/ast_00004.jpg`` is ``astronaut/ast_00004`` every way). ``a.b.jpg`` is
    ``a_b``, so its packed member ``a_b.jpg`` reads back under WebDataset's rule (the key is
    the path up to the first dot of its base name) with the same key; folders keep their
    dots, as WebDataset keeps them (``v1.2/x.jpg`` is ``v1.2/x``, also in a tar of the
    folder).
    """
    folder, slash, name = relative.rpartition("/")
    stem = name.rsplit(".", 1)[0] if "." in name else name
    return f"{folder}{slash}{stem.replace('.', '_')}"


@dataclass(frozen=True, slots=True)
class SampleRef:
    """Where one sample of the input lives.

    Attributes:
        key: The sample's key in the shards: unique, no ``.`` in its last segment, no
            leading ``/``, no ``..``.
        location: The file, object URL or container it is read from (for messages too).
        size: Estimated bytes of the sample (for cutting shards by size).
        label: Class index, or -1 for none.
        start: Byte offset of the sample inside ``location`` (for container formats).
        length: Byte length inside ``location``; -1 means the whole file or object.
        extra: Reader-specific details (for example the member layout of a tar sample).
    """

    key: str
    location: str
    size: int
    label: int = -1
    start: int = 0
    length: int = -1
    extra: tuple[tuple[str, int, int], ...] = field(default=())


@dataclass(frozen=True, slots=True)
class Sample:
    """One sample's bytes, ready for the shard writer.

    Attributes:
        key: As in its :class:`SampleRef`.
        fields: Extension (``"jpg"``, ``"png"``, ``"cls"``, ``"json"``, ...) -> bytes, in the
            order the members will be written.
        label: Class index, or -1.
        video: For a sample with a video member, its extension and seek index (filled in
            by the pack as it checks the member; see :mod:`stoker.format.video`).
    """

    key: str
    fields: dict[str, bytes]
    label: int = -1
    video: tuple[str, VideoIndex] | None = None


class SampleReader(Protocol):
    """A foreign input: lists references cheaply and reads any one of them.

    Readers raise :class:`~stoker.errors.SourceError` for bad input (an unreadable file, a
    bad CRC, an empty class folder, a duplicate key), naming the file or record.
    """

    @property
    def description(self) -> str:
        """What was read, for summaries (``"image folder s3://b/train (1,000 files)"``)."""
        ...

    @property
    def class_names(self) -> Sequence[str]:
        """Class names, indexed by label; empty if the input has no classes."""
        ...

    def refs(self) -> list[SampleRef]:
        """Every sample of the input, in the input's own deterministic order."""
        ...

    def read(self, ref: SampleRef) -> Sample:
        """Read one sample's bytes."""
        ...

    def requests(self) -> dict[str, int]:
        """Counters of the requests made so far (requests, bytes, retries, errors)."""
        ...


@runtime_checkable
class AsyncSampleReader(SampleReader, Protocol):
    """A reader whose reads can also run on an I/O engine's loop (bucket inputs).

    The packer keeps many such reads in flight from one thread instead of one thread per
    read, which matters when each read is a round trip to a remote bucket.
    """

    @property
    def reads_remote(self) -> bool:
        """Whether reads go to a remote store (otherwise threads serve local files best)."""
        ...

    async def read_async(self, ref: SampleRef) -> Sample:
        """Async form of :meth:`read`; runs on the process's I/O engine."""
        ...
