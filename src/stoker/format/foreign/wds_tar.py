"""Read WebDataset tar shards: one sample per run of members that share a key.

:func:`scan_tar` parses tar headers itself (POSIX ustar, GNU and pax) rather than going
through :mod:`tarfile`, because packing and indexing need the exact byte offset of every
member's data: a sample is later read with one ranged request over its span. Members are
grouped by the WebDataset rule: the key is the member path up to the first ``.`` of its
base name, the extension is the rest, lowercased, and one sample's members are consecutive.

Anything that is not a plain file or a directory (links, devices, fifos, sparse files) is
refused, and so are absolute paths and ``..`` segments, bad header checksums and truncated
archives, with a :class:`~stoker.errors.SourceError` that names the tar and the member.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from stoker.errors import SourceError
from stoker.format.foreign.base import Sample, SampleRef
from stoker.format.foreign.locations import LocationReader

logger = logging.getLogger(__name__)

_BLOCK = 512
_ZERO_BLOCK = bytes(_BLOCK)
_REGULAR = (b"0", b"\0", b"7")
_DIRECTORY = (b"5", b"D", b"V")  # directory, GNU dump directory, GNU volume label
_PAX = (b"x", b"g")
_GNU_LONG = (b"L", b"K")  # long name, long link name
_REFUSED = {
    b"1": "a hard link",
    b"2": "a symbolic link",
    b"3": "a character device",
    b"4": "a block device",
    b"6": "a fifo",
    b"S": "a GNU sparse file",
    b"M": "a GNU multi-volume continuation",
}


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
        SourceError: A bad header checksum or number, a truncated archive, an unsafe or
            unsupported member, a sample whose members are not consecutive, or an extension
            that appears twice in one sample.
    """
    view = memoryview(data).cast("B")
    total = len(view)
    samples: list[TarSample] = []
    seen: set[str] = set()
    global_pax: dict[str, bytes] = {}
    pending_pax: dict[str, bytes] = {}
    long_name: bytes | None = None
    chain_start: int | None = None  # first header of the member being assembled
    current: TarSample | None = None
    pos = 0
    while True:
        if pos + _BLOCK > total:
            where = "inside a header" if pos < total else "without the end-of-archive marker"
            raise SourceError(f"{name}: truncated tar: data ends {where} at offset {pos}")
        header = bytes(view[pos : pos + _BLOCK])
        if header == _ZERO_BLOCK:
            if chain_start is not None:
                raise SourceError(
                    f"{name}: extended header at offset {chain_start} is followed by the "
                    "end of the archive instead of a member"
                )
            break
        _verify_checksum(header, name=name, offset=pos)
        typeflag = header[156:157]
        size = _number(header[124:136], name=name, offset=pos, field="size")
        if typeflag not in _PAX and typeflag not in _GNU_LONG:
            merged = {**global_pax, **pending_pax}
            if merged.get("size"):
                size = _pax_int(merged["size"], name=name, offset=pos)
        data_offset = pos + _BLOCK
        padded_end = data_offset + -(-size // _BLOCK) * _BLOCK
        if padded_end > total:
            raise SourceError(
                f"{name}: truncated tar: member at offset {pos} declares {size} bytes of "
                f"data but the archive ends at offset {total}"
            )
        start = pos if chain_start is None else chain_start
        pos = padded_end
        if typeflag in _PAX:
            raw = bytes(view[data_offset : data_offset + size])
            records = _parse_pax(raw, name=name, offset=start)
            if typeflag == b"g":
                global_pax.update(records)
                global_pax = {k: v for k, v in global_pax.items() if v}
            else:
                pending_pax.update(records)
            chain_start = start
            continue
        if typeflag in _GNU_LONG:
            if typeflag == b"L":
                long_name = bytes(view[data_offset : data_offset + size]).split(b"\0", 1)[0]
            chain_start = start
            continue
        merged = {**global_pax, **pending_pax}
        path = _member_path(header, merged, long_name, name=name, offset=start)
        pending_pax, long_name, chain_start = {}, None, None
        if any(k.startswith("GNU.sparse.") for k in merged):
            raise SourceError(f"{name}: member {path!r} is a GNU sparse file; not supported")
        if typeflag in _REFUSED:
            raise SourceError(f"{name}: member {path!r} is {_REFUSED[typeflag]}; not allowed")
        if typeflag in _DIRECTORY or (typeflag in _REGULAR and path.endswith("/")):
            continue
        if typeflag not in _REGULAR:
            raise SourceError(
                f"{name}: member {path!r} has unsupported type {typeflag.decode('latin-1')!r}"
            )
        split = _split_member(path, name=name)
        if split is None:
            logger.debug("%s: skipping member %r without an extension", name, path)
            continue
        key, ext = split
        if current is not None and current.key == key:
            if any(ext == member[0] for member in current.members):
                raise SourceError(f"{name}: sample {key!r} has two {ext!r} members ({path!r})")
            current.members.append((ext, data_offset, size))
            current = TarSample(key, current.members, current.span_start, padded_end)
            samples[-1] = current
            continue
        if key in seen:
            raise SourceError(
                f"{name}: member {path!r} continues sample {key!r} after other samples; "
                "a sample's members must be consecutive"
            )
        seen.add(key)
        current = TarSample(key, [(ext, data_offset, size)], start, padded_end)
        samples.append(current)
    return samples


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
        found = [location for location, _ in self._locations.list(self._location, (".tar",))]
        if not found:
            raise SourceError(f"{self._location}: no .tar files found")
        return found

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


def _verify_checksum(header: bytes, *, name: str, offset: int) -> None:
    stored = _number(header[148:156], name=name, offset=offset, field="checksum")
    rest = header[:148] + header[156:]
    unsigned = sum(rest) + 8 * ord(" ")
    if stored == unsigned:
        return
    # Some old writers summed signed chars; tarfile accepts both, and so do we.
    signed = unsigned - 256 * sum(1 for byte in rest if byte >= 0x80)
    if stored != signed:
        raise SourceError(
            f"{name}: bad header checksum at offset {offset}: stored {stored}, "
            f"computed {unsigned} (corrupt or not a tar)"
        )


def _number(raw: bytes, *, name: str, offset: int, field: str) -> int:
    if raw[:1] and raw[0] & 0x80:
        # GNU base-256: the high bit marks it; 0xff would mean a negative number.
        if raw[0] == 0xFF:
            raise SourceError(f"{name}: negative {field} in header at offset {offset}")
        return int.from_bytes(bytes([raw[0] & 0x7F]) + raw[1:], "big")
    text = raw.split(b"\0", 1)[0].strip()
    try:
        return int(text, 8) if text else 0
    except ValueError:
        raise SourceError(
            f"{name}: bad {field} field {raw!r} in header at offset {offset}"
        ) from None


def _pax_int(value: bytes, *, name: str, offset: int) -> int:
    if not value.isdigit():
        raise SourceError(f"{name}: bad pax size {value!r} in header at offset {offset}")
    return int(value)


def _parse_pax(raw: bytes, *, name: str, offset: int) -> dict[str, bytes]:
    # Records are "LENGTH KEY=VALUE\n", LENGTH counting the whole record.
    records: dict[str, bytes] = {}
    pos = 0
    while pos < len(raw) and raw[pos] != 0:
        space = raw.find(b" ", pos)
        length_text = raw[pos:space] if space > pos else b""
        length = int(length_text) if length_text.isdigit() else 0
        record = raw[space + 1 : pos + length]
        key, sep, value = record[:-1].partition(b"=")
        if length <= 0 or pos + length > len(raw) or not record.endswith(b"\n") or not sep:
            raise SourceError(f"{name}: malformed pax header at offset {offset}")
        try:
            records[key.decode("utf-8")] = value
        except UnicodeDecodeError:
            raise SourceError(
                f"{name}: pax header at offset {offset} has a non-UTF-8 key"
            ) from None
        pos += length
    return records


def _member_path(
    header: bytes, pax: dict[str, bytes], long_name: bytes | None, *, name: str, offset: int
) -> str:
    if pax.get("path"):
        raw = pax["path"]
    elif long_name is not None:
        raw = long_name
    else:
        raw = header[:100].split(b"\0", 1)[0]
        prefix = header[345:500].split(b"\0", 1)[0]
        # Only POSIX ustar headers have a prefix field; GNU headers keep other data there.
        if header[257:265] == b"ustar\x0000" and prefix:
            raw = prefix + b"/" + raw
    try:
        path = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise SourceError(f"{name}: member name {raw!r} at offset {offset} is not UTF-8") from None
    if path.startswith("/"):
        raise SourceError(f"{name}: member {path!r} has an absolute path; not allowed")
    if ".." in path.split("/"):
        raise SourceError(f"{name}: member {path!r} has a '..' path segment; not allowed")
    return path


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
    key = "/".join([*parts[:-1], stem])
    if "." in key:
        raise SourceError(
            f"{name}: member {path!r} gives key {key!r}, and keys may not contain '.'"
        )
    return key, ext.lower()
