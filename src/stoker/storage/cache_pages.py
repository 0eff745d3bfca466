"""Pages of an object as :class:`~stoker.storage.cached.CachedStore` reads them: what a
read holds of a page (all of its bytes, or spans of it read from the disk cache), and the
arithmetic of pages, runs of pages and the parts inside them."""

from __future__ import annotations

#: A page's bytes: from the disk cache, or a view into the ranged read that fetched it.
Page = bytes | memoryview
#: ``[start, end)`` ranges inside one page, in page offsets.
Spans = list[tuple[int, int]]


class PageBytes:
    """One page's bytes as a read got them: ``whole``, or ``spans`` of ``(start, end,
    bytes)`` read from the cache."""

    __slots__ = ("spans", "whole")

    def __init__(
        self, whole: Page | None, spans: list[tuple[int, int, bytes]] | None = None
    ) -> None:
        self.whole = whole
        self.spans = spans or []

    def whole_page(self) -> Page:
        """All the page's bytes (a read that asked for the whole page has them)."""
        if self.whole is None:
            raise RuntimeError("a read of spans of a page was used as the whole page")
        return self.whole

    def take(self, start: int, end: int) -> memoryview:
        """The bytes ``[start, end)`` of the page (a view, no copy)."""
        if self.whole is not None:
            return memoryview(self.whole)[start:end]
        for span_start, span_end, data in self.spans:
            if span_start <= start and end <= span_end:
                return memoryview(data)[start - span_start : end - span_start]
        raise RuntimeError(f"bytes [{start}, {end}) of a page were not read")


def merge_spans(spans: Spans) -> Spans:
    """``spans`` sorted, with those that touch or overlap joined (one read each)."""
    merged: Spans = []
    for start, end in sorted(spans):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def cut(
    start: int, end: int, page_bytes: int, spans: dict[int, Spans]
) -> list[tuple[int, int, int]]:
    """``[start, end)`` of an object as (page, span start, span end) pieces, each span also
    added to its page's ``spans``."""
    pieces = []
    for page in range(start // page_bytes, (end - 1) // page_bytes + 1):
        base = page * page_bytes
        a, b = max(start, base) - base, min(end, base + page_bytes) - base
        spans.setdefault(page, []).append((a, b))
        pieces.append((page, a, b))
    return pieces


def assemble(pages: dict[int, Page], start: int, end: int, page_bytes: int) -> memoryview:
    """Bytes ``[start, end)`` of an object from the whole pages that hold them."""
    first = min(pages) * page_bytes
    if len(pages) == 1:  # the usual case for small reads: no join, no copy
        return memoryview(pages[first // page_bytes])[start - first : end - first]
    joined = b"".join(pages[p] for p in sorted(pages))
    return memoryview(joined)[start - first : end - first]


def page_runs(pages: list[int], size: int, page_bytes: int) -> list[tuple[int, int, list[int]]]:
    """Sorted ``pages`` of an object of ``size`` bytes, adjacent ones together, as
    (start, end, pages) of one ranged read each."""
    groups: list[list[int]] = []
    for page in pages:
        if groups and groups[-1][-1] == page - 1:
            groups[-1].append(page)
        else:
            groups.append([page])
    return [(g[0] * page_bytes, min((g[-1] + 1) * page_bytes, size), g) for g in groups]


def split_pages(
    data: memoryview, pages: list[int], run_start: int, page_bytes: int
) -> dict[int, Page]:
    """A ranged read's bytes from ``run_start`` cut into its pages (views, not copies)."""
    view = memoryview(data)
    return {page: view[page * page_bytes - run_start :][:page_bytes] for page in pages}
