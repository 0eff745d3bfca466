"""Read TFRecord files of ``tf.train.Example`` records, without TensorFlow or protobuf.

A record is framed as a uint64 little-endian length, the masked CRC32C of those 8 bytes,
the data, and the masked CRC32C of the data; the data is a serialized ``tf.train.Example``
(:mod:`stoker.format.foreign.tf_example` decodes and encodes it). :func:`write_tfrecord` is
the matching writer, for tests and small inputs. CRC32C comes from ``google-crc32c``
(``pip install 'stoker[tfrecord]'``).
"""

from __future__ import annotations

import json
import os
import re
import struct
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from stoker.errors import SourceError
from stoker.format.foreign.base import Sample, SampleRef
from stoker.format.foreign.locations import LocationReader, is_remote
from stoker.format.foreign.tf_example import (
    Example,
    FeatureValue,
    decode_example,
    encode_example,
    json_document,
)
from stoker.format.spec import sniff_image_extension
from stoker.storage import parse_url

IMAGE_FEATURES = ("image/encoded", "image", "image_raw", "img", "jpeg", "encoded")
LABEL_FEATURES = ("image/class/label", "label", "class", "target", "y")
CLASS_TEXT_FEATURE = "image/class/text"

# Matches the TFRecord part of a file name: a final .tfrecord(s)/.tfr or a .tfrecord- infix.
_TFRECORD_NAME = re.compile(r"\.(tfrecords?|tfr)$|\.tfrecord(?=-)", re.IGNORECASE)
_HEADER_BYTES = 12  # uint64 length + uint32 CRC of the length
_CHUNK_BYTES = 16 << 20  # the scan reads a file in pieces this size, not whole
_MAX_NAMED_LABEL = 1 << 20  # class names form a list indexed by label


def write_tfrecord(
    path: str | os.PathLike[str], examples: Iterable[Mapping[str, FeatureValue]]
) -> None:
    """Write ``tf.train.Example`` records to a local TFRecord file.

    ``bytes`` and ``str`` (as UTF-8) become a ``bytes_list``, ``int`` an ``int64_list``,
    ``float`` a ``float_list``; a list becomes a list of its elements' kind (floats if any
    element is a float). Numeric lists are packed, as TensorFlow writes them.

    Args:
        path: The file to create or overwrite.
        examples: One mapping of feature name to value per record.

    Raises:
        ValueError: A value of another type, an empty list, or an int outside int64.
        ImportError: ``google-crc32c`` is not installed.
    """
    crc = _crc32c_function()
    with open(path, "wb") as f:
        for example in examples:
            data = encode_example(example)
            length = struct.pack("<Q", len(data))
            f.write(length + _masked(crc(length)).to_bytes(4, "little"))
            f.write(data + _masked(crc(data)).to_bytes(4, "little"))


class TFRecordReader:
    """Reads images and labels from TFRecord files of ``tf.train.Example`` records.

    Each record is one sample, keyed ``{file stem}_{record index:08d}`` (``.`` becomes ``_``;
    the folder of a file below ``location`` stays in the key). Its fields are the image under
    ``jpg``, ``png``, ``webp`` or ``bin`` (by magic bytes); ``cls``, the label in decimal, if
    there is one; and ``json``, an object of every other feature: one value as itself, more
    as a list, bytes as UTF-8 text (bytes that are not UTF-8 are left out), floats that are
    not finite as ``null``. Labels are taken as stored (1-based labels stay 1-based); -1
    means no label.

    Args:
        location: A TFRecord file, or a folder or object prefix whose files ending in
            ``.tfrecord``, ``.tfrecords`` or ``.tfr``, or containing ``.tfrecord-``, are
            read in sorted order.
        storage_options: Options for the stores of object URLs.
        image_feature: The ``bytes_list`` feature of the encoded image (its first value).
            If None, the first of :data:`IMAGE_FEATURES` that the record has.
        label_feature: The ``int64_list`` feature of the label, with one value. If None,
            the first of :data:`LABEL_FEATURES` with one value, or no label.
        class_names: Names indexed by label. If None, built from ``image/class/text``.
        verify_crc: Check each record's data CRC (the length CRC is always checked).
    """

    def __init__(
        self,
        location: str,
        *,
        storage_options: Mapping[str, Any] | None = None,
        image_feature: str | None = None,
        label_feature: str | None = None,
        class_names: Sequence[str] | None = None,
        verify_crc: bool = True,
    ) -> None:
        self._location = location
        self._io = LocationReader(storage_options)
        self._image_feature = image_feature
        self._label_feature = label_feature
        self._given_names = None if class_names is None else list(class_names)
        self._verify_crc = verify_crc
        self._files: list[tuple[str, int]] | None = None
        self._refs: list[SampleRef] | None = None
        self._record_count: int | None = None
        self._texts: dict[int, str] = {}
        self._top_label = -1

    def __getstate__(self) -> dict[str, Any]:
        # References can number millions, and a process that reads them needs none.
        return {**self.__dict__, "_refs": None}

    @property
    def description(self) -> str:
        """What is read, e.g. ``"TFRecord s3://b/train (3 files, 12,345 records)"``."""
        files = len(self._list_files())
        counts = f"{files:,} file{'' if files == 1 else 's'}"
        if self._record_count is not None:
            counts += f", {self._record_count:,} records"
        return f"TFRecord {self._location} ({counts})"

    @property
    def class_names(self) -> Sequence[str]:
        """The given names, or the ``image/class/text`` of each label (scans if needed).

        Read names are indexed by label, up to the largest label; a label without text is
        named by its number.

        Raises:
            SourceError: A label too large to index a list of names.
        """
        if self._given_names is not None:
            return list(self._given_names)
        if self._record_count is None:
            self._scan()
        top = self._top_label if self._texts else -1
        if top >= _MAX_NAMED_LABEL:
            raise SourceError(f"{self._location}: label {top} is too large; pass class_names")
        return [self._texts.get(label, str(label)) for label in range(top + 1)]

    def requests(self) -> dict[str, int]:
        """Counters of the requests made so far (none for local files)."""
        return self._io.requests()

    def refs(self) -> list[SampleRef]:
        """One reference per record: files in sorted order, records in file order.

        Raises:
            SourceError: No TFRecord files; or a bad CRC, a truncated or undecodable record,
                or a record without the image or label feature, named by file, record index
                and byte offset.
        """
        return list(self._scan() if self._refs is None else self._refs)

    def read(self, ref: SampleRef) -> Sample:
        """Read and decode the record that ``ref`` points to.

        Raises:
            SourceError: The bytes cannot be read, fail the data CRC, or do not decode.
        """
        where = f"{ref.location}: record {ref.key} at byte offset {ref.start - _HEADER_BYTES}"
        raw = self._io.read(ref.location, ref.start, ref.length + 4)
        data = raw[:-4]
        if self._verify_crc:  # the file may have changed since the scan
            _check_crc(_crc32c_function(), data, raw[-4:], where, "data")
        example = decode_example(data, where)
        image_name, image = self._image(example, where)
        label_name, label = self._label(example, where)
        fields = {sniff_image_extension(image): image}
        if label != -1:
            fields["cls"] = str(label).encode()
        doc = json_document(example, skip={image_name, label_name})
        if doc:
            fields["json"] = json.dumps(doc, sort_keys=True, ensure_ascii=False).encode()
        return Sample(ref.key, fields, label)

    def _list_files(self) -> list[tuple[str, int]]:
        if self._files is None:
            try:
                found, root = self._io.list(self._location), _root(self._location)
            except (OSError, ValueError) as exc:
                raise SourceError(f"{self._location}: cannot list: {exc}") from exc
            # A location that names one file is read whatever the file is called.
            self._files = [
                (path, size)
                for path, size in found
                if path in (root, self._location) or _TFRECORD_NAME.search(path.rsplit("/", 1)[-1])
            ]
            if not self._files:
                raise SourceError(
                    f"{self._location}: no files ending in .tfrecord, .tfrecords or .tfr, "
                    "or containing .tfrecord-"
                )
        return self._files

    def _scan(self) -> list[SampleRef]:
        crc = _crc32c_function()
        root = _root(self._location)
        refs: list[SampleRef] = []
        texts: dict[int, str] = {}
        stems: dict[str, str] = {}
        for location, size in self._list_files():
            stem = _key_stem(location, root)
            if stems.setdefault(stem, location) != location:
                raise SourceError(f"{location} and {stems[stem]} both give keys {stem}_*")
            for index, offset, data in _records(self._io, location, size, crc, self._verify_crc):
                where = f"{location}: record {index} at byte offset {offset}"
                example = decode_example(data, where)
                self._image(example, where)
                label = self._label(example, where)[1]
                text = example.bytes_lists.get(CLASS_TEXT_FEATURE)
                if self._given_names is None and label >= 0 and text:
                    name = text[0].decode("utf-8", errors="replace")
                    if texts.setdefault(label, name) != name:
                        raise SourceError(
                            f"{where}: label {label} is {name!r}, "
                            f"but {texts[label]!r} in an earlier record"
                        )
                key = f"{stem}_{index:08d}"
                start = offset + _HEADER_BYTES
                refs.append(SampleRef(key, location, len(data), label, start, len(data)))
        self._refs, self._texts, self._record_count = refs, texts, len(refs)
        self._top_label = max((ref.label for ref in refs), default=-1)
        return refs

    def _image(self, example: Example, where: str) -> tuple[str, bytes]:
        for name in (self._image_feature,) if self._image_feature else IMAGE_FEATURES:
            values = example.bytes_lists.get(name)
            if values:
                return name, values[0]
        wanted = repr(self._image_feature) if self._image_feature else ", ".join(IMAGE_FEATURES)
        raise SourceError(
            f"{where}: no image feature ({wanted}) as a non-empty bytes_list; the record has "
            f"{example.summary() or 'no features'}; pass image_feature"
        )

    def _label(self, example: Example, where: str) -> tuple[str | None, int]:
        for name in (self._label_feature,) if self._label_feature else LABEL_FEATURES:
            values = example.int64_lists.get(name)
            if values is not None and len(values) == 1:
                return name, values[0]
        if self._label_feature is None:
            return None, -1
        raise SourceError(
            f"{where}: label feature {self._label_feature!r} is not an int64_list of one "
            f"value; the record has {example.summary() or 'no features'}"
        )


def _crc32c_function() -> Callable[[bytes], int]:
    try:
        import google_crc32c
    except ImportError as exc:
        raise ImportError(
            "TFRecord files need google-crc32c: pip install 'stoker[tfrecord]'"
        ) from exc
    value: Callable[[bytes], int] = google_crc32c.value
    return value


def _masked(crc: int) -> int:
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def _check_crc(
    crc: Callable[[bytes], int], data: bytes, stored: bytes, where: str, what: str
) -> None:
    expected, found = int.from_bytes(stored, "little"), _masked(crc(data))
    if found != expected:
        hint = " (a corrupt or compressed file?)" if what == "length" else ""
        raise SourceError(
            f"{where}: bad {what} CRC: stored {expected:#010x}, computed {found:#010x}{hint}"
        )


def _records(
    io: LocationReader, location: str, size: int, crc: Callable[[bytes], int], verify: bool
) -> Iterator[tuple[int, int, bytes]]:
    """Yield ``(index, offset, data)`` per record, reading the file in chunks."""
    buf, buf_start = b"", 0  # buf holds the file from offset buf_start on
    offset = index = 0
    while offset < size:
        where = f"{location}: record {index} at byte offset {offset}"
        if size - offset < _HEADER_BYTES:
            raise SourceError(f"{where}: truncated header, file ends after {size - offset} bytes")
        buf, buf_start = _fill(io, location, size, buf, buf_start, offset, offset + _HEADER_BYTES)
        pos = offset - buf_start
        _check_crc(crc, buf[pos : pos + 8], buf[pos + 8 : pos + 12], where, "length")
        length = int.from_bytes(buf[pos : pos + 8], "little")
        end = offset + _HEADER_BYTES + length + 4
        if end > size:
            raise SourceError(
                f"{where}: truncated record of {length:,} data bytes; the file ends "
                f"{size - offset:,} bytes after the record starts"
            )
        buf, buf_start = _fill(io, location, size, buf, buf_start, offset, end)
        pos = offset + _HEADER_BYTES - buf_start
        data = buf[pos : pos + length]
        if verify:
            _check_crc(crc, data, buf[pos + length : pos + length + 4], where, "data")
        yield index, offset, data
        offset, index = end, index + 1


def _fill(
    io: LocationReader, location: str, size: int, buf: bytes, buf_start: int, offset: int, end: int
) -> tuple[bytes, int]:
    """Extend ``buf`` to file offset ``end``, dropping the bytes before ``offset``."""
    have = buf_start + len(buf)
    if end <= have:
        return buf, buf_start
    length = min(max(_CHUNK_BYTES, end - have), size - have)
    return buf[offset - buf_start :] + io.read(location, have, length), offset


def _root(location: str) -> str:
    """``location`` as :meth:`LocationReader.list` spells the files below it."""
    return str(
        parse_url(location) if is_remote(location) else Path(location.removeprefix("file://"))
    )


def _key_stem(location: str, root: str) -> str:
    prefix = root.rstrip("/") + "/"
    if location.startswith(prefix):
        folder, _, name = location.removeprefix(prefix).rpartition("/")
    else:  # the location named this one file
        folder, name = "", location.rsplit("/", 1)[-1]
    # train.tfrecord-00000-of-00010 -> train-00000-of-00010; a.tfrecord -> a
    name = _TFRECORD_NAME.sub("", name)
    return (f"{folder}/{name}" if folder else name).replace(".", "_")
