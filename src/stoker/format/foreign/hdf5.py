"""Read images (and optional labels) from one HDF5 file.

The ``images`` dataset holds either pixel arrays (``N x H x W`` or ``N x H x W x C``
``uint8``, encoded per sample to PNG or JPEG with Pillow) or already-encoded images as
variable-length byte strings (h5py vlen bytes or ``uint8`` sequences, fixed-size opaque
``np.void`` or ``S`` strings), which are kept byte for byte. An optional ``labels`` dataset
holds one integer per image; class names come from the reader's argument or from the file's
``class_names`` attribute.

A file behind an object URL is downloaded whole, once per process that reads it, to a
temporary file the reader owns and removes when it is closed or garbage collected. Random
access into remote HDF5 (HTTP range reads through a virtual file driver) is out of scope.
"""

from __future__ import annotations

import importlib
import io
import json
import logging
import os
import tempfile
import weakref
from collections.abc import Mapping, Sequence
from pathlib import Path, PurePosixPath
from types import ModuleType, TracebackType
from typing import Any, Literal

import numpy as np

from stoker.errors import SourceError, StokerError
from stoker.format.foreign.base import Sample, SampleRef
from stoker.format.foreign.locations import LocationReader, is_remote
from stoker.format.spec import sniff_image_extension

logger = logging.getLogger(__name__)

ImageFormat = Literal["png", "jpg"]
_DEFAULT_LABELS = "labels"
_DOWNLOAD_CHUNK_BYTES = 64 * 1024 * 1024
_SIZE_CHUNK_ROWS = 4096
_JPEG_QUALITY = 95


def _import_h5py() -> ModuleType:
    try:
        return importlib.import_module("h5py")
    except ImportError as exc:
        raise ImportError(
            "reading HDF5 needs h5py; install it with: pip install 'stoker[hdf5]'"
        ) from exc


class _Handle:
    """An open file and the temporary copy it may live in; closing removes the copy."""

    def __init__(self, file: Any, layout: Literal["pixels", "encoded"], temp: str | None) -> None:
        self.file = file
        self.layout = layout
        self.temp = temp

    def close(self) -> None:
        try:
            self.file.close()
        finally:
            if self.temp is not None:
                Path(self.temp).unlink(missing_ok=True)


class HDF5Reader:
    """Read one HDF5 file of images, one sample per row of the images dataset.

    Keys are ``f"{stem}_{row:08d}"`` where ``stem`` is the file's name without its
    extension (dots replaced by ``_``). Each sample has the image under its extension
    (``png``/``jpg`` for pixel arrays; ``jpg``, ``png``, ``webp`` or ``bin`` by magic for
    encoded bytes) and, if labelled, the label as ``cls`` text.

    The file is opened lazily; pickling drops the open file, so each process opens (and
    for a remote file, downloads) its own copy. Use :meth:`close` or ``with`` to release
    the file and its temporary copy early.

    Args:
        location: A local ``.h5``/``.hdf5`` file or an object URL.
        storage_options: Options for the store opened for an object URL.
        images: Name (path) of the images dataset.
        labels: Name of the labels dataset, or None to ignore labels. If the default name
            is missing from the file the samples are unlabelled; any other missing name is
            an error.
        class_names: Class names indexed by label; else the file's ``class_names``
            attribute, if any.
        image_format: Encoding of pixel arrays: lossless ``"png"`` or ``"jpg"`` (quality
            95, for 1 or 3 channels only).

    Raises:
        ValueError: ``image_format`` is not ``"png"`` or ``"jpg"``.
    """

    def __init__(
        self,
        location: str,
        *,
        storage_options: Mapping[str, Any] | None = None,
        images: str = "images",
        labels: str | None = _DEFAULT_LABELS,
        class_names: Sequence[str] | None = None,
        image_format: ImageFormat = "png",
    ) -> None:
        if image_format not in ("png", "jpg"):
            raise ValueError(f"image_format must be 'png' or 'jpg', got {image_format!r}")
        self._location = location
        self._locations = LocationReader(storage_options)
        self._images = images
        self._labels = labels
        self._given_names = tuple(class_names) if class_names is not None else None
        self._image_format: ImageFormat = image_format
        self._counts = ""
        self._handle: _Handle | None = None
        self._finalizer: weakref.finalize[[], HDF5Reader] | None = None

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_handle"] = state["_finalizer"] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)

    def __enter__(self) -> HDF5Reader:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        """Close the file and remove its temporary copy; a later read opens it again."""
        if self._finalizer is not None:
            self._finalizer()
        self._handle = self._finalizer = None

    @property
    def description(self) -> str:
        """What was read, for summaries."""
        return f"HDF5 {self._location}{self._counts}"

    @property
    def class_names(self) -> Sequence[str]:
        """The given class names, else the file's ``class_names`` attribute, else empty."""
        if self._given_names is not None:
            return self._given_names
        raw = self._open().file.attrs.get("class_names")
        return () if raw is None else _names(raw, location=self._location)

    def requests(self) -> dict[str, int]:
        """Counters of the requests made so far (none for local files)."""
        return self._locations.requests()

    def refs(self) -> list[SampleRef]:
        """One reference per image row, in row order.

        Raises:
            SourceError: The file cannot be opened, a dataset is missing, the images
                dataset has an unsupported type or shape, or the labels do not match it.
        """
        handle = self._open()
        images = handle.file[self._images]
        if not len(images):
            raise SourceError(f"{self._location}: the images dataset {images.name} is empty")
        labels = self._read_labels(_import_h5py(), handle.file, rows=len(images))
        if handle.layout == "pixels":
            row_bytes = int(np.prod(images.shape[1:])) * images.dtype.itemsize
            sizes: Sequence[int] = [row_bytes] * len(images)
        else:
            sizes = self._encoded_sizes(images)
        stem = PurePosixPath(self._location).stem.replace(".", "_")
        refs = [
            SampleRef(
                key=f"{stem}_{row:08d}",
                location=self._location,
                size=sizes[row],
                label=-1 if labels is None else int(labels[row]),
                extra=(("row", row, 1),),
            )
            for row in range(len(images))
        ]
        self._counts = f" ({len(refs):,} images)"
        return refs

    def read(self, ref: SampleRef) -> Sample:
        """Read one row: the encoded image bytes, plus ``cls`` if labelled.

        Raises:
            SourceError: The reference names no row of this file.
        """
        handle = self._open()
        images = handle.file[self._images]
        row = ref.extra[0][1] if ref.extra and ref.extra[0][0] == "row" else -1
        if not 0 <= row < len(images):
            raise SourceError(f"{self._location}: sample {ref.key!r} names no row of {images.name}")
        value = images[row]
        ext: str = self._image_format
        if handle.layout == "pixels":
            data = _encode(value, self._image_format)
        else:
            data = _encoded_bytes(value, where=f"{self._location}: {images.name}[{row}]")
            ext = sniff_image_extension(data)
        fields: dict[str, bytes] = {ext: data}
        if ref.label >= 0:
            fields["cls"] = str(ref.label).encode()
        return Sample(ref.key, fields, ref.label)

    def _open(self) -> _Handle:
        if self._handle is not None:
            return self._handle
        h5py = _import_h5py()
        temp = self._download() if is_remote(self._location) else None
        path = temp or self._location.removeprefix("file://")
        if Path(path).is_dir():
            raise SourceError(
                f"{self._location} is a folder: the HDF5 reader takes one .h5 file (a folder of "
                "images is read as an image folder: leave the format to be guessed)"
            )
        try:
            file = h5py.File(path, "r")
        except OSError as exc:
            if temp is not None:
                Path(temp).unlink(missing_ok=True)
            # h5py's message runs on with its file descriptor, buffers and offsets.
            reason = os.strerror(exc.errno) if exc.errno else str(exc).split(" (")[-1].split(",")[0]
            raise SourceError(
                f"{self._location}: cannot open as HDF5: {reason.strip(')')}"
            ) from exc
        handle = _Handle(file, "encoded", temp)
        try:
            handle.layout = self._layout(h5py, file)
        except BaseException:
            handle.close()
            raise
        self._handle = handle
        self._finalizer = weakref.finalize(self, handle.close)
        return handle

    def _download(self) -> str:
        store, key = self._locations.store_for(self._location)
        try:
            size = store.head(key).size
        except (OSError, StokerError) as exc:
            raise SourceError(f"{self._location}: cannot read: {exc}") from exc
        descriptor, temp = tempfile.mkstemp(prefix="stoker-hdf5-", suffix=".h5")
        try:
            with os.fdopen(descriptor, "wb") as out:
                for start in range(0, size, _DOWNLOAD_CHUNK_BYTES):
                    length = min(_DOWNLOAD_CHUNK_BYTES, size - start)
                    out.write(self._locations.read(self._location, start, length))
        except BaseException:
            Path(temp).unlink(missing_ok=True)
            raise
        logger.info("downloaded %s (%d bytes) to %s", self._location, size, temp)
        return temp

    def _dataset(self, h5py: ModuleType, file: Any, name: str) -> Any:
        # Data must come from this file: an external link, a virtual dataset or external
        # storage would make packing read other local files that the file's author chose.
        parts = [part for part in name.split("/") if part]
        for depth in range(1, len(parts) + 1):
            link = file.get("/".join(parts[:depth]), getlink=True)
            if isinstance(link, h5py.ExternalLink):
                raise SourceError(
                    f"{self._location}: {name!r} goes through an external link to "
                    f"{link.filename}:{link.path}; not allowed"
                )
        found = file.get(name)
        if isinstance(found, h5py.Dataset):
            if found.is_virtual or found.external:
                raise SourceError(
                    f"{self._location}: dataset {name!r} reads other files (a virtual dataset "
                    "or external storage); not allowed"
                )
            return found
        datasets: list[str] = []
        file.visititems(
            lambda path, item: datasets.append(path) if isinstance(item, h5py.Dataset) else None
        )
        what = "is not a dataset" if found is not None else "does not exist"
        raise SourceError(
            f"{self._location}: dataset {name!r} {what}; datasets in the file: {datasets[:20]}"
        )

    def _layout(self, h5py: ModuleType, file: Any) -> Literal["pixels", "encoded"]:
        images = self._dataset(h5py, file, self._images)
        dtype, shape = images.dtype, images.shape
        if len(shape) == 1 and dtype.kind in "OVS":
            vlen = h5py.check_vlen_dtype(dtype) if dtype.kind == "O" else None
            if dtype.kind != "O" or vlen in (bytes, str, np.dtype("uint8"), np.dtype("int8")):
                return "encoded"
        if dtype == np.uint8 and (
            len(shape) == 3 or (len(shape) == 4 and shape[3] in (1, 2, 3, 4))
        ):
            channels = shape[3] if len(shape) == 4 else 1
            if self._image_format == "jpg" and channels in (2, 4):
                raise SourceError(
                    f"{self._location}: {images.name} has {channels} channels, which JPEG "
                    "cannot hold; use image_format='png'"
                )
            return "pixels"
        raise SourceError(
            f"{self._location}: unsupported images dataset {images.name}: dtype {dtype}, "
            f"shape {shape}; expected uint8 N x H x W [x C], C in 1-4, or N encoded byte strings"
        )

    def _read_labels(
        self, h5py: ModuleType, file: Any, *, rows: int
    ) -> np.ndarray[Any, Any] | None:
        if self._labels is None:
            return None
        if self._labels == _DEFAULT_LABELS and self._labels not in file:
            logger.info("%s has no %r dataset; samples are unlabelled", self._location, "labels")
            return None
        dataset = self._dataset(h5py, file, self._labels)
        values = np.asarray(dataset[()])
        if values.ndim == 2 and values.shape[1] == 1:
            values = values[:, 0]
        if values.dtype.kind not in "iu" or values.ndim != 1:
            raise SourceError(
                f"{self._location}: labels dataset {dataset.name} must hold N integers; found "
                f"dtype {values.dtype}, shape {values.shape}"
            )
        if len(values) != rows:
            raise SourceError(
                f"{self._location}: {len(values)} labels in {dataset.name} for {rows} images"
            )
        if len(values) and values.min() < -1:
            raise SourceError(f"{self._location}: label {values.min()} is below -1 (no label)")
        return values

    def _encoded_sizes(self, images: Any) -> list[int]:
        if images.dtype.kind != "O":
            return [images.dtype.itemsize] * len(images)
        sizes: list[int] = []
        for start in range(0, len(images), _SIZE_CHUNK_ROWS):
            chunk = images[start : start + _SIZE_CHUNK_ROWS]
            sizes.extend(len(value) for value in chunk)
        return sizes


def _names(raw: Any, *, location: str) -> tuple[str, ...]:
    if isinstance(raw, bytes):
        raw = raw.decode("utf-8")
    if isinstance(raw, str):
        try:
            raw = json.loads(raw)
        except json.JSONDecodeError:
            raw = [raw]
    items = raw.tolist() if isinstance(raw, np.ndarray) else raw
    if not isinstance(items, list):
        raise SourceError(f"{location}: class_names attribute is not a list of names: {raw!r}")
    return tuple(item.decode("utf-8") if isinstance(item, bytes) else str(item) for item in items)


def _encode(pixels: np.ndarray[Any, Any], image_format: ImageFormat) -> bytes:
    from PIL import Image

    if pixels.ndim == 3 and pixels.shape[2] == 1:
        pixels = pixels[:, :, 0]
    out = io.BytesIO()
    image = Image.fromarray(np.ascontiguousarray(pixels))
    if image_format == "png":
        image.save(out, format="PNG")
    else:
        image.save(out, format="JPEG", quality=_JPEG_QUALITY)
    return out.getvalue()


def _encoded_bytes(value: Any, *, where: str) -> bytes:
    if isinstance(value, bytes):  # vlen bytes and np.bytes_ ("S", trailing NULs dropped)
        return bytes(value)
    if isinstance(value, np.ndarray | np.void):  # vlen uint8 sequences, opaque
        return value.tobytes()
    raise SourceError(f"{where}: expected encoded image bytes, found {type(value).__name__}")
