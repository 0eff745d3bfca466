"""A picture of what the pipeline feeds the model: a grid of transformed samples."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw, ImageFont

from stoker.pipeline.loader import Loader


def sample_grid(
    loader: Loader, *, rows: int = 3, columns: int = 3, title_px: int = 18
) -> Image.Image:
    """The first ``rows * columns`` samples of ``loader``, each titled with its class name.

    Args:
        loader: Any loader; its first batches are read.
        rows: Grid rows.
        columns: Grid columns.
        title_px: Height of the caption strip above each image.

    Raises:
        ValueError: The loader yielded no images.
    """
    images, captions = _first_samples(loader, rows * columns)
    return _render(images, captions, rows=rows, columns=columns, title_px=title_px)


def save_sample_grid(
    loader: Loader, out: str | Path, *, rows: int = 3, columns: int = 3, title_px: int = 18
) -> tuple[Path, int]:
    """Render :func:`sample_grid` to a PNG file; return its path and how many samples it
    shows (fewer than its cells when the loader has fewer)."""
    path = Path(out)
    images, captions = _first_samples(loader, rows * columns)
    grid = _render(images, captions, rows=rows, columns=columns, title_px=title_px)
    grid.save(path, format="PNG")
    return path, len(images)


def _first_samples(loader: Loader, wanted: int) -> tuple[list[np.ndarray], list[str]]:
    images: list[np.ndarray] = []
    captions: list[str] = []
    names = loader.dataset.class_names
    for batch in loader:
        for image, label, key in zip(
            batch["image"], batch["label"].tolist(), batch["key"], strict=True
        ):
            images.append(np.asarray(image))
            name = names[label] if 0 <= label < len(names) else "(no label)"
            captions.append(f"{name}  [{key.rsplit('/', 1)[-1]}]")
            if len(images) == wanted:
                break
        if len(images) == wanted:
            break
    if not images:
        raise ValueError(f"{loader.dataset.url}: no samples to show")
    return images, captions


def _render(
    images: list[np.ndarray], captions: list[str], *, rows: int, columns: int, title_px: int
) -> Image.Image:
    cell_h = max(i.shape[0] for i in images)
    cell_w = max(i.shape[1] for i in images)
    grid = Image.new("RGB", (columns * cell_w, rows * (cell_h + title_px)), "white")
    draw = ImageDraw.Draw(grid)
    font = ImageFont.load_default()
    for n, (image, caption) in enumerate(zip(images, captions, strict=True)):
        x = (n % columns) * cell_w
        y = (n // columns) * (cell_h + title_px)
        draw.text((x + 3, y + 3), caption[: max(8, cell_w // 7)], fill="black", font=font)
        grid.paste(Image.fromarray(image), (x, y + title_px))
    return grid
