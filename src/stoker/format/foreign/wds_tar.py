"""Read WebDataset tar shards: one sample per run of members that share a key.

:func:`scan_tar` parses tar headers itself (POSIX ustar, GNU and pax) rather than going
through :mod:`tarfile`, because packing and indexing need the exact byte offset of every
member's data: a sample is later read with one ranged request over its span. Members are
grouped by the WebDataset rule: the key is the member path up to the first ``.`` of its
base name, the extension is the rest, lowercased, and one sample's members are consecutive.

Headers are walked by :func:`stoker.format.tar.iter_members`, which the shard reader uses
too. Anything that is not a plain file or a directory (links, devices, fifos, sparse files) is
refused, and so are names with an absolute path, a drive letter, a ``..`` segment, a
backslash or a control character, directory entries between the members of one sample, bad
header checksums and truncated archives, with a :class:`~stoker.errors.SourceError` that
names the tar and the member.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from stoker.errors import SourceError
from stoker.format.foreign.base import Sample, SampleRef
from stoker.format.foreign.locations import LocationReader
from stoker.format.tar import is_directory, iter_members, member_problem

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class TarSample:
    """One WebDataset sample inside a tar.

    Attributes:
        key: The member path up to the first ``.`` of its base name.
        members: ``(ext, data_offset, data_size)`` per member, in tar order; offsets are
            absolute positions in the tar.
        span_start: Offset of the first header block of the sample's first member
            (including any pax or GNU long-name headers that apply to it).
        span_end: Offset just past the last member's data, padded to 512 bytes.
    """

    key: str
    members: list[tuple[str, int, int]]
    span_start: int
    span_end: int


def scan_tar(data: bytes | memoryview, *, name: str) -> list[TarSample]:
    """Find the samples of a WebDataset tar and where their members' bytes lie.

    Members without an extension (no ``.`` in the base name) are skipped, as WebDataset
    does; directories are skipped. The archive must end with the end-of-archive marker.

    Args:
        data: The whole tar.
        name: The tar's location, for messages.

    Returns:
        The samples in tar order.

    Raises:
        SourceError: A compressed tar, a bad header checksum or number, a truncated
            archive, an unsafe or unsupported member, a sample whose members are not
            consecutive, or an extension that appears twice in one sample.
    """
    refuse_compressed(data, name=name)
    samples: list[TarSample] = []
    seen: set[str] = set()
    current: TarSample | None = None
    directory: str | None = None  # a directory entry seen since the current sample's last member
    members = iter_members(data, whole_archive=True)
    while True:
        try:
            member = next(members, None)
        except ValueError as exc:
            raise SourceError(f"{name}: {exc}") from None
        if member is None:
            break
        path = member.path
        if is_directory(member):
            directory = path
            continue
        problem = member_problem(member)
        if problem is not None:
            raise SourceError(f"{name}: member {path!r} {problem}; not allowed")
        split = _split_member(path, name=name)
        if split is None:
            logger.debug("%s: skipping member %r without an extension", name, path)
            continue
        key, ext = split
        if current is not None and current.key == key:
            # The reader parses the span between them too, and refuses directory entries.
            if directory is not None:
                raise SourceError(
                    f"{name}: directory entry {directory!r} lies between the members of "
                    f"sample {key!r}"
                )
            if any(ext == m[0] for m in current.members):
                raise SourceError(f"{name}: sample {key!r} has two {ext!r} members ({path!r})")
            current.members.append((ext, member.data_start, member.size))
            current = TarSample(key, current.members, current.span_start, member.end)
            samples[-1] = current
            continue
        if key in seen:
            raise SourceError(
                f"{name}: member {path!r} continues sample {key!r} after other samples; "
                "a sample's members must be consecutive"
            )
        seen.add(key)
        directory = None
        current = TarSample(
            key, [(ext, member.data_start, member.size)], member.chain_start, member.end
        )
        samples.append(current)
    return samples


#: Magic bytes of the compressions a tar is often wrapped in.
COMPRESSION_MAGIC = {
    b"\x1f\x8b": "gzip",
    b"BZh": "bzip2",
    b"\xfd7zXZ\x00": "xz",
    b"\x28\xb5\x2f\xfd": "zstd",
}
#: Names of compressed tars, which are refused, naming them, rather than passed over.
COMPRESSED_TAR_SUFFIXES = (".tar.gz", ".tgz", ".tar.bz2", ".tar.xz", ".tar.zst")


def refuse_compressed(data: bytes | memoryview, *, name: str) -> None:
    """Refuse a compressed tar: a sample is read later by one ranged GET at its offset in
    the tar, which a compressed stream does not have.

    Raises:
        SourceError: Naming the tar and its compression.
    """
    head = bytes(data[:6])
    for magic, compression in COMPRESSION_MAGIC.items():
        if head.startswith(magic):
            raise SourceError(
                f"{name}: a {compression}-compressed tar; stoker reads uncompressed tars "
                "(each sample is one ranged read at its offset): decompress it first "
                "(gunzip, or `stoker pack` it from the decompressed tar)"
            )


def refuse_compressed_names(names: Sequence[str], *, where: str) -> None:
    """Refuse a folder whose only tars are compressed ones, naming one of them.

    Raises:
        SourceError: Naming how many there are and the first.
    """
    compressed = sorted(n for n in names if n.lower().endswith(COMPRESSED_TAR_SUFFIXES))
    if compressed:
        raise SourceError(
            f"{where}: no uncompressed .tar files, but {len(compressed)} compressed ones "
            f"({compressed[0]}, ...); stoker reads uncompressed tars: decompress them first"
        )


class WebDatasetTarReader:
    """Read WebDataset tars: one tar, or every ``.tar`` under a directory or prefix.

    Each tar is read whole once by :meth:`refs` to find its samples; :meth:`read` then
    fetches one sample's span with a single ranged read. The label of a sample is the
    integer in its ``.cls`` member, or -1 if it has none.

    Args:
        location: A ``.tar`` file or object, or a directory or URL prefix holding ``.tar``
            files (read in sorted order).
        storage_options: Options for the stores opened for object URLs.
        class_names: Class names indexed by label, if known.
    """

    def __init__(
        self,
        location: str,
        *,
        storage_options: Mapping[str, Any] | None = None,
        class_names: Sequence[str] | None = None,
    ) -> None:
        self._location = location
        self._locations = LocationReader(storage_options)
        self._class_names = tuple(class_names or ())
        self._counts = ""

    @property
    def description(self) -> str:
        """What was read, for summaries."""
        return f"webdataset tars {self._location}{self._counts}"

    @property
    def class_names(self) -> Sequence[str]:
        """Class names given to the reader; empty if none were."""
        return self._class_names

    def tars(self) -> list[str]:
        """The tar files read, in order.

        Raises:
            SourceError: There are none.
        """
        listed = [location for location, _ in self._locations.list(self._location)]
        found = [location for location in listed if location.lower().endswith(".tar")]
        if not found:
            refuse_compressed_names(listed, where=self._location)
            raise SourceError(f"{self._location}: no .tar files found")
        return found

    def requests(self) -> dict[str, int]:
        """Counters of the requests made so far (none for local files)."""
        return self._locations.requests()

    def refs(self) -> list[SampleRef]:
        """One reference per sample, tar by tar, in tar order.

        Raises:
            SourceError: A tar is unreadable or invalid (see :func:`scan_tar`), a ``.cls``
                member is not an integer, two tars hold the same key, or there are no
                samples at all.
        """
        refs: list[SampleRef] = []
        owners: dict[str, str] = {}
        tars = self.tars()
        for tar in tars:
            data = self._locations.read(tar)
            for sample in scan_tar(data, name=tar):
                other = owners.setdefault(sample.key, tar)
                if other != tar:
                    raise SourceError(f"{tar}: sample key {sample.key!r} also appears in {other}")
                refs.append(_to_ref(sample, data, tar=tar))
        if not refs:
            raise SourceError(f"{self._location}: no samples in {len(tars)} tar file(s)")
        self._counts = f" ({len(tars):,} tars, {len(refs):,} samples)"
        return refs

    def read(self, ref: SampleRef) -> Sample:
        """Read one sample's members with one ranged read of its span.

        Raises:
            SourceError: The span cannot be read, or the reference's member layout does
                not fit inside it.
        """
        span = self._locations.read(ref.location, ref.start, ref.length)
        fields: dict[str, bytes] = {}
        for ext, offset, size in ref.extra:
            if offset < 0 or size < 0 or offset + size > len(span):
                raise SourceError(
                    f"{ref.location}: sample {ref.key!r} member {ext!r} at +{offset} "
                    f"({size} bytes) lies outside its {len(span)}-byte span"
                )
            fields[ext] = span[offset : offset + size]
        return Sample(ref.key, fields, ref.label)


def _to_ref(sample: TarSample, data: bytes, *, tar: str) -> SampleRef:
    label = -1
    for ext, offset, size in sample.members:
        if ext == "cls":
            text = data[offset : offset + size].strip()
            try:
                label = int(text)
            except ValueError:
                raise SourceError(
                    f"{tar}: sample {sample.key!r} has a .cls member that is not an "
                    f"integer: {text[:40]!r}"
                ) from None
    return SampleRef(
        key=sample.key,
        location=tar,
        size=sum(size for _, _, size in sample.members),
        label=label,
        start=sample.span_start,
        length=sample.span_end - sample.span_start,
        extra=tuple((ext, off - sample.span_start, size) for ext, off, size in sample.members),
    )


def _split_member(path: str, *, name: str) -> tuple[str, str] | None:
    """(key, ext) of a member path, or None if its base name has no extension."""
    parts = [part for part in path.split("/") if part not in ("", ".")]
    if not parts:
        return None
    stem, dot, ext = parts[-1].partition(".")
    if not dot:
        return None
    if not stem or not ext:
        raise SourceError(f"{name}: member {path!r} has no key before or no extension after '.'")
    # Folders may have dots (``v1.2/0001.jpg``: key ``v1.2/0001``), as in WebDataset.
    return "/".join([*parts[:-1], stem]), ext.lower()
