"""A picture of what the pipeline feeds the model: a grid of transformed samples, each
titled with its class and key, with its caption (a ``txt`` field) under it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image, ImageDraw, ImageFont

from stoker.errors import BucketNotFoundError
from stoker.format.reader import ShardDataset, open_dataset
from stoker.pipeline.loader import Loader
from stoker.pipeline.source import stores_images
from stoker.pipeline.sources import DatasetSource

#: Samples in ``stoker show``'s grid (3 x 3).
GRID_CELLS = 9

#: Batch fields holding a caption, in the order they are looked for (WebDataset's names).
CAPTION_FIELDS = ("txt", "text", "caption", "transcript")

#: Lines of caption under each image.
CAPTION_LINES = 2


@dataclass(slots=True)
class _Cells:
    images: list[np.ndarray]
    titles: list[str]
    captions: list[str | None]  # None: the batches carry no caption field


def open_for_show(
    url: str, *, storage_options: Mapping[str, Any] | None = None
) -> tuple[ShardDataset | str, bool]:
    """The packed dataset at ``url`` and whether its samples have images; or ``url`` itself
    where there is no index (a folder of images, which the Loader streams as it is or says
    what it found instead) and True."""
    try:
        dataset = open_dataset(url, storage_options=storage_options)
    except BucketNotFoundError:
        raise
    except FileNotFoundError:
        return url, True
    return dataset, dataset.index.videos is not None or stores_images(DatasetSource(dataset))


def sample_grid(
    loader: Loader, *, rows: int = 3, columns: int = 3, title_px: int = 18
) -> Image.Image:
    """The first ``rows * columns`` samples of ``loader``, each titled with its class name
    and key, and its caption (the first of :data:`CAPTION_FIELDS` the batches carry,
    truncated to two lines) under it.

    Args:
        loader: Any loader whose batches carry images; its first batches are read.
        rows: Grid rows.
        columns: Grid columns.
        title_px: Height of the title strip above each image (and of a caption line).

    Raises:
        ValueError: The loader yielded no images.
    """
    cells = _first_samples(loader, rows * columns)
    return _render(cells, rows=rows, columns=columns, title_px=title_px)


def save_sample_grid(
    loader: Loader, out: str | Path, *, rows: int = 3, columns: int = 3, title_px: int = 18
) -> tuple[Path, int]:
    """Render :func:`sample_grid` to a PNG file; return its path and how many samples it
    shows (fewer than its cells when the loader has fewer)."""
    path = Path(out)
    cells = _first_samples(loader, rows * columns)
    grid = _render(cells, rows=rows, columns=columns, title_px=title_px)
    grid.save(path, format="PNG")
    return path, len(cells.images)


def _first_samples(loader: Loader, wanted: int) -> _Cells:
    cells = _Cells([], [], [])
    names = loader.dataset.class_names
    for batch in loader:
        if "image" not in batch:
            raise ValueError(f"{loader.dataset.url}: the batches carry no images to show")
        field = next((f for f in CAPTION_FIELDS if f in batch), None)
        captions: list[Any] = batch[field] if field else [None] * len(batch["key"])
        for image, label, key, caption in zip(
            batch["image"], batch["label"].tolist(), batch["key"], captions, strict=True
        ):
            if image is None:  # missing="none" and no image in this sample
                continue
            cells.images.append(_still(np.asarray(image)))
            name = names[label] if 0 <= label < len(names) else "(no label)"
            cells.titles.append(f"{name}  [{key.rsplit('/', 1)[-1]}]")
            cells.captions.append(None if field is None else _caption(caption))
            if len(cells.images) == wanted:
                return cells
    if not cells.images:
        raise ValueError(f"{loader.dataset.url}: no samples to show")
    return cells


def _still(image: np.ndarray) -> np.ndarray:
    """One picture of a sample: an image as it is; a clip (or window) of frames as its
    first, middle and last frames side by side."""
    if image.ndim != 4:
        return image
    return np.concatenate([image[0], image[len(image) // 2], image[-1]], axis=1)


def _caption(value: Any) -> str:
    """A caption's text on one line ("" for a sample without one)."""
    if value is None:
        return ""
    if isinstance(value, bytes | bytearray | memoryview):
        value = bytes(value).decode("utf-8", errors="replace")
    return " ".join(str(value).split())


def _render(cells: _Cells, *, rows: int, columns: int, title_px: int) -> Image.Image:
    images = cells.images
    cell_h = max(i.shape[0] for i in images)
    cell_w = max(i.shape[1] for i in images)
    captioned = any(c is not None for c in cells.captions)
    caption_px = CAPTION_LINES * (title_px - 4) + 4 if captioned else 0
    row_h = title_px + cell_h + caption_px
    grid = Image.new("RGB", (columns * cell_w, rows * row_h), "white")
    draw = ImageDraw.Draw(grid)
    font = ImageFont.load_default()
    for n, (image, title, caption) in enumerate(
        zip(images, cells.titles, cells.captions, strict=True)
    ):
        x = (n % columns) * cell_w
        y = (n // columns) * row_h
        _text(draw, (x + 3, y + 3), _fit(draw, font, title, cell_w - 6), font)
        grid.paste(Image.fromarray(image), (x, y + title_px))
        if caption:
            top = y + title_px + cell_h + 2
            for line in _wrap(draw, font, caption, cell_w - 6, CAPTION_LINES):
                _text(draw, (x + 3, top), line, font)
                top += title_px - 4
    return grid


def _text(draw: ImageDraw.ImageDraw, xy: tuple[int, int], text: str, font: Any) -> None:
    try:
        draw.text(xy, text, fill="black", font=font)
    except UnicodeEncodeError:  # a bitmap font (Pillow without FreeType) is Latin-1 only
        draw.text(xy, text.encode("latin-1", "replace").decode("latin-1"), fill="black", font=font)


def _width(draw: ImageDraw.ImageDraw, font: Any, text: str) -> float:
    try:
        return float(draw.textlength(text, font=font))
    except UnicodeEncodeError:
        return float(draw.textlength(text.encode("latin-1", "replace"), font=font))


def _fit(draw: ImageDraw.ImageDraw, font: Any, text: str, width: int) -> str:
    """``text``, cut with "..." to fit ``width`` pixels."""
    if _width(draw, font, text) <= width:
        return text
    low, high = 0, len(text)  # the longest prefix that fits with its "..."
    while low < high:
        middle = (low + high + 1) // 2
        if _width(draw, font, text[:middle] + "...") <= width:
            low = middle
        else:
            high = middle - 1
    return text[:low].rstrip() + "..."


def _wrap(draw: ImageDraw.ImageDraw, font: Any, text: str, width: int, lines: int) -> list[str]:
    """``text`` in at most ``lines`` lines of ``width`` pixels, broken at spaces where it
    can be; the last line cut with "..." when the text goes on."""
    out: list[str] = []
    words = text.split(" ")
    while words and len(out) < lines:
        line = words.pop(0)
        while words and _width(draw, font, f"{line} {words[0]}") <= width:
            line += " " + words.pop(0)
        if len(out) == lines - 1 and words:
            line = _fit(draw, font, f"{line} {' '.join(words)}", width)
            words = []
        out.append(_fit(draw, font, line, width))
    return out
