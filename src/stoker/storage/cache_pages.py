"""What a cached read holds of a page: all of its bytes, or spans of it read from the disk
cache (:class:`~stoker.storage.cached.CachedStore`)."""

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
