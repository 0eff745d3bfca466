"""Pictures of what the profile measured, drawn with Pillow alone.

- :func:`render_doctor`: the doctor's verdict as a title, the loader's timeline (one row
  per consumer, pipeline, request and decode track), and bars for where the training loop's
  time and its wait went and how busy each resource was, then every line of the advice.
- :func:`render_comparison`: the seed comparison, one bar per method: setup (download or
  pack) plus one epoch, with the first batch marked.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from PIL import Image, ImageDraw, ImageFont

from stoker.core.metrics import Stage
from stoker.profile.trace import PlacedEvent, place_events

if TYPE_CHECKING:
    from stoker.profile.comparison import Comparison
    from stoker.profile.diagnosis import Diagnosis

Font = ImageFont.FreeTypeFont | ImageFont.ImageFont
RGB = tuple[int, int, int]

STAGE_COLOURS: dict[str, RGB] = {
    Stage.CONSUMER_STEP: (84, 162, 75),
    Stage.CONSUMER_WAIT: (228, 87, 86),
    Stage.WAIT_FETCH: (158, 202, 233),
    Stage.WAIT_DECODE: (255, 191, 121),
    Stage.COLLATE: (114, 183, 178),
    Stage.FETCH: (76, 120, 168),
    Stage.DECODE: (245, 133, 24),
    Stage.TRANSFORM: (178, 121, 162),
    Stage.INDEX: (186, 176, 172),
}
_WAIT_COLOURS: dict[str, RGB] = {
    "store": STAGE_COLOURS[Stage.FETCH],
    "decode": STAGE_COLOURS[Stage.DECODE],
    "transform": STAGE_COLOURS[Stage.TRANSFORM],
    "collate": STAGE_COLOURS[Stage.COLLATE],
    "other": (200, 200, 200),
}
_INK: RGB = (30, 30, 30)
_GRID: RGB = (225, 225, 225)
_BAD: RGB = (190, 40, 40)
_GOOD: RGB = (40, 130, 50)


def _font(size: int) -> Font:
    return ImageFont.load_default(size=size)


def _nice_step(span: float, ticks: int = 8) -> float:
    raw = max(span, 1e-9) / ticks
    power = 10.0 ** math.floor(math.log10(raw))
    return next(float(m * power) for m in (1, 2, 5, 10) if m * power >= raw)


def _x_axis(
    draw: ImageDraw.ImageDraw, left: int, right: int, y: int, span_s: float, label: str
) -> None:
    font = _font(12)
    draw.line([(left, y), (right, y)], fill=_INK)
    step = _nice_step(span_s)
    tick = 0.0
    while tick <= span_s * 1.0001:
        x = left + (right - left) * tick / span_s
        draw.line([(x, y), (x, y + 4)], fill=_INK)
        draw.text((x, y + 6), f"{tick:g}", fill=_INK, font=font, anchor="ma")
        tick = round(tick + step, 9)
    draw.text(((left + right) / 2, y + 22), label, fill=_INK, font=font, anchor="ma")


def _legend(
    draw: ImageDraw.ImageDraw, x: int, y: int, items: Sequence[tuple[str, RGB]], width: int
) -> int:
    """Draw swatches left to right, wrapping at ``width``; return the y below them."""
    font = _font(12)
    start = x
    for name, colour in items:
        text_w = draw.textlength(name, font=font)
        if x + 18 + text_w > start + width:
            x, y = start, y + 18
        draw.rectangle([x, y + 2, x + 12, y + 14], fill=colour, outline=_INK)
        draw.text((x + 17, y + 1), name, fill=_INK, font=font)
        x += int(18 + text_w + 16)
    return y + 20


def _stacked_bar(
    draw: ImageDraw.ImageDraw,
    box: tuple[int, int, int, int],
    parts: Sequence[tuple[str, float, RGB]],
) -> None:
    """A horizontal bar split into ``parts`` (shares summing to at most 1), labelled."""
    left, top, right, bottom = box
    font = _font(12)
    x = float(left)
    for name, share, colour in parts:
        width = (right - left) * max(share, 0.0)
        if width <= 0:
            continue
        draw.rectangle([x, top, x + width, bottom], fill=colour)
        text = f"{name} {100 * share:.0f}%"
        if draw.textlength(text, font=font) < width - 6:
            draw.text((x + width / 2, (top + bottom) / 2), text, fill=_INK, font=font, anchor="mm")
        x += width
    draw.rectangle([left, top, right, bottom], outline=_INK)


def render_doctor(diagnosis: Diagnosis, *, width: int = 1400) -> Image.Image:
    """The doctor's picture: verdict, timeline, time and load bars, and all the advice."""
    d = diagnosis
    placed, tracks = place_events(d.events, origin_s=d.origin_s)
    advice = advice_lines(d, width=width)
    row = max(10, min(26, 360 // max(len(tracks), 1)))
    timeline_h = row * max(len(tracks), 1)
    height = 210 + timeline_h + 60 + 40 + 3 * 44 + 50 + 20 * max(len(advice), 1)
    image = Image.new("RGB", (width, height), "white")
    draw = ImageDraw.Draw(image)
    margin, label_w = 20, 130

    _doctor_header(draw, d, margin=margin)
    y = _doctor_timeline(
        draw,
        d,
        placed,
        tracks,
        row=row,
        margin=margin,
        left=margin + label_w,
        right=width - margin,
    )
    y = _doctor_bars(draw, d, y, margin=margin, right=width - margin)
    draw.text((margin, y + 4), "What to do:", fill=_INK, font=_font(14))
    for n, line in enumerate(advice):
        draw.text((margin + 100, y + 4 + 20 * n), line, fill=_INK, font=_font(13))
    return image.crop((0, 0, width, y + 4 + 20 * max(len(advice), 1) + 16))


def _doctor_header(draw: ImageDraw.ImageDraw, d: Diagnosis, *, margin: int) -> None:
    """The verdict and what was measured, in three lines."""
    colour = _GOOD if d.bottleneck == "consumer" else _BAD
    draw.text((margin, 14), d.verdict.upper(), fill=colour, font=_font(28))
    draw.text(
        (margin, 52),
        f"At a {1000 * d.step_s:g} ms training step, the loop waited for data "
        f"{100 * d.input_bound_share:.0f}% of the time; dominant stage: {d.dominant_stage}.",
        fill=_INK,
        font=_font(17),
    )
    draw.text(
        (margin, 78),
        f"{d.url}  |  batch {d.batch_size}, {d.batches} batches measured in {d.seconds:.1f} s "
        f"({d.images_per_s:,.0f} images/s), first batch after {d.first_batch_s:.2f} s  |  "
        f"{d.num_threads} decode threads, {d.prefetch} read groups in flight",
        fill=(90, 90, 90),
        font=_font(13),
    )


def _doctor_timeline(
    draw: ImageDraw.ImageDraw,
    d: Diagnosis,
    placed: list[PlacedEvent],
    tracks: list[str],
    *,
    row: int,
    margin: int,
    left: int,
    right: int,
) -> int:
    """Every event on its track, from ``left`` (the track names before it) to ``right``,
    the start of the measured window marked; returns the bottom of its legend."""
    timeline_h = row * max(len(tracks), 1)
    top = 140
    draw.text((margin, top - 36), "Timeline (one row per track)", fill=_INK, font=_font(14))
    end_s = max((p.ts_us + p.dur_us for p in placed), default=1.0) / 1e6
    span = max(end_s, 1e-3)
    for n, track in enumerate(tracks):
        y = top + n * row
        if n % 2 == 0:
            draw.rectangle([left, y, right, y + row - 1], fill=(246, 246, 246))
        draw.text((left - 6, y + row / 2), track, fill=_INK, font=_font(12), anchor="rm")
    index = {track: n for n, track in enumerate(tracks)}
    present = {p.event.stage for p in placed}
    for p in placed:
        y = top + index[p.track] * row
        x0 = left + (right - left) * p.ts_us / 1e6 / span
        x1 = max(x0 + 1, left + (right - left) * (p.ts_us + p.dur_us) / 1e6 / span)
        if x1 - x0 > 3:
            x1 -= 1  # a white seam between spans that meet
        fill = STAGE_COLOURS.get(p.event.stage, (150, 150, 150))
        draw.rectangle([x0, y + 2, x1, y + row - 3], fill=fill)
    bottom = top + timeline_h
    window_x = left + (right - left) * (d.window_start_s - d.origin_s) / span
    for y in range(top, bottom, 6):
        draw.line([(window_x, y), (window_x, y + 3)], fill=_INK)
    draw.text((window_x + 3, top - 15), "measured from here", fill=_INK, font=_font(11))
    _x_axis(draw, left, right, bottom + 2, span, "seconds since the start")
    y = _legend(
        draw,
        left,
        bottom + 44,
        [(name, c) for name, c in STAGE_COLOURS.items() if name in present],
        right - left,
    )
    return y


def _doctor_bars(
    draw: ImageDraw.ImageDraw, d: Diagnosis, y: int, *, margin: int, right: int
) -> int:
    """Where the training loop's time went, where its wait went, and each resource's load;
    returns the y below them."""
    y += 18
    bar_left = margin + 220
    waiting = d.input_bound_share
    rows: list[tuple[str, list[tuple[str, float, RGB]]]] = [
        (
            "Training loop time",
            [
                ("waiting for data", waiting, STAGE_COLOURS[Stage.CONSUMER_WAIT]),
                ("step", 1 - waiting, STAGE_COLOURS[Stage.CONSUMER_STEP]),
            ],
        ),
        (
            f"Its wait ({d.input_bound_share * d.seconds:.2f} s) went to",
            [(k, v, _WAIT_COLOURS[k]) for k, v in d.wait_shares.items()],
        ),
    ]
    for label, parts in rows:
        draw.text((margin, y + 6), label, fill=_INK, font=_font(14))
        _stacked_bar(draw, (bar_left, y, right, y + 26), parts)
        y += 44
    draw.text((margin, y + 6), "Load (0-100%)", fill=_INK, font=_font(14))
    third = (right - bar_left) // 3
    loads = [
        ("requests in flight", d.load["store"], STAGE_COLOURS[Stage.FETCH]),
        ("decode threads busy", d.load["decode_threads"], STAGE_COLOURS[Stage.DECODE]),
        (
            f"CPU of {os.cpu_count() or 1} cores (load {d.load['machine']:.1f}/core)",
            d.load["cpu"],
            (120, 120, 120),
        ),
    ]
    for n, (name, share, fill) in enumerate(loads):
        x0 = bar_left + n * third
        x1 = x0 + third - 24
        share = min(max(share, 0.0), 1.0)
        draw.rectangle([x0, y, x0 + (x1 - x0) * share, y + 26], fill=fill)
        draw.rectangle([x0, y, x1, y + 26], outline=_INK)
        draw.text(
            ((x0 + x1) / 2, y + 13),
            f"{name} {100 * share:.0f}%",
            fill=_INK,
            font=_font(12),
            anchor="mm",
        )
    y += 44
    return y


def wrap_text(text: str, font: Font, width: float) -> list[str]:
    """``text`` cut at spaces into lines no wider than ``width`` pixels in ``font`` (a word
    wider than that gets a line of its own)."""
    lines: list[str] = []
    for word in text.split():
        if lines and font.getlength(f"{lines[-1]} {word}") <= width:
            lines[-1] = f"{lines[-1]} {word}"
        else:
            lines.append(word)
    return lines


def advice_lines(diagnosis: Diagnosis, *, width: int = 1400) -> list[str]:
    """Every line of the doctor's advice as :func:`render_doctor` draws it: each item
    wrapped to the picture's width, its first line marked with a dash."""
    font = _font(13)
    lines: list[str] = []
    for item in diagnosis.advice:
        wrapped = wrap_text(item, font, width - 160)
        lines += [f"- {wrapped[0]}"] + [f"  {rest}" for rest in wrapped[1:]]
    return lines


def render_comparison(comparison: Comparison, *, width: int = 1200) -> Image.Image:
    """Bars of the seed comparison: setup plus one epoch per method, first batch marked."""
    rows = comparison.rows
    bar_h, gap = 30, 26
    label_w = 330
    height = 130 + len(rows) * (bar_h + gap) + 80
    image = Image.new("RGB", (width, height), "white")
    draw = ImageDraw.Draw(image)
    margin = 20
    draw.text(
        (margin, 14),
        "Time to first batch and to the end of the first epoch",
        fill=_INK,
        font=_font(24),
    )
    draw.text(
        (margin, 48),
        f"{comparison.files:,} files ({comparison.bytes / 1e6:,.1f} MB) from {comparison.url}; "
        f"batch {comparison.batch_size}; every method decodes with the same transform "
        f"on {comparison.threads} threads",
        fill=(90, 90, 90),
        font=_font(13),
    )
    left, right = margin + label_w, width - margin - 150
    span = max((r.setup_s + r.epoch_s for r in rows), default=1.0) * 1.05 or 1.0
    top = 100
    step = _nice_step(span)
    tick = step
    while tick <= span:
        x = left + (right - left) * tick / span
        draw.line([(x, top - 6), (x, top + len(rows) * (bar_h + gap))], fill=_GRID)
        tick += step
    setup_fill: RGB = (190, 190, 190)
    epoch_fill = STAGE_COLOURS[Stage.FETCH]
    for n, r in enumerate(rows):
        y = top + n * (bar_h + gap)
        draw.text((left - 10, y + bar_h / 2), r.method, fill=_INK, font=_font(14), anchor="rm")
        x_setup = left + (right - left) * r.setup_s / span
        x_end = left + (right - left) * (r.setup_s + r.epoch_s) / span
        if r.setup_s > 0:
            draw.rectangle([left, y, x_setup, y + bar_h], fill=setup_fill)
        draw.rectangle([x_setup, y, max(x_end, x_setup + 1), y + bar_h], fill=epoch_fill)
        x_first = left + (right - left) * min(r.first_batch_s, span) / span
        draw.polygon(
            [(x_first, y - 4), (x_first + 6, y + 4), (x_first, y + 12), (x_first - 6, y + 4)],
            fill=_BAD,
            outline=_INK,
        )
        total = f"{r.setup_s + r.epoch_s:.1f} s" + (" (est.)" if r.estimated else "")
        draw.text((x_end + 8, y + bar_h / 2), total, fill=_INK, font=_font(14), anchor="lm")
        draw.text(
            (left + 4, y + bar_h + 2),
            f"first batch {r.first_batch_s:.1f} s, epoch {r.epoch_s:.1f} s, "
            f"{r.images_per_s:,.0f} images/s, {r.requests_per_epoch:,} GETs per epoch",
            fill=(90, 90, 90),
            font=_font(11),
        )
    axis_y = top + len(rows) * (bar_h + gap) + 4
    _x_axis(draw, left, right, axis_y, span, "seconds")
    _legend(
        draw,
        left,
        axis_y + 44,
        [
            ("setup: download or pack (once)", setup_fill),
            ("one epoch of batches", epoch_fill),
            ("first batch", _BAD),
        ],
        right - left,
    )
    return image


def save_png(image: Image.Image, path: str | os.PathLike[str]) -> Path:
    """Write ``image`` as a PNG and return its path."""
    target = Path(path)
    image.save(target, format="PNG")
    return target
