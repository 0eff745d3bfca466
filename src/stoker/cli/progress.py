"""Rich progress bars: one for transfers (the ProgressSink), one for packs."""

from __future__ import annotations

from types import TracebackType
from typing import TYPE_CHECKING

from rich.console import Console
from rich.progress import (
    BarColumn,
    DownloadColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)

if TYPE_CHECKING:
    from stoker.pack.report import PackProgress


def pack_bar(noun: str, *, enabled: bool) -> tuple[Progress, PackProgress]:
    """A bar of ``noun`` (samples, documents) done of total, and the pack's progress
    callback that moves it. Silent when ``enabled`` is False."""
    bar = Progress(
        "pack",
        BarColumn(),
        MofNCompleteColumn(),
        noun,
        TimeRemainingColumn(),
        console=Console(stderr=True),
        disable=not enabled,
    )
    task = bar.add_task("pack", total=None)

    def progress(total: int | None, samples: int, _nbytes: int) -> None:
        bar.update(task, total=total, advance=samples)

    return bar, progress


class BarProgress:
    """One line on stderr: files done of total, bytes, rate and ETA.

    Silent when ``enabled`` is False (``--no-progress``, or stderr is not a terminal).
    """

    def __init__(self, description: str, *, enabled: bool) -> None:
        self._progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            TextColumn("{task.fields[files_done]}/{task.fields[files_total]} files"),
            DownloadColumn(),
            TransferSpeedColumn(),
            TimeRemainingColumn(),
            console=Console(stderr=True),
            disable=not enabled,
        )
        self._description = description
        self._task: TaskID | None = None
        self._files_done = 0

    def start(self, *, files: int, total_bytes: int) -> None:
        self._task = self._progress.add_task(
            self._description, total=max(total_bytes, 1), files_done=0, files_total=files
        )

    def advance(self, *, files: int, nbytes: int) -> None:
        if self._task is not None:
            self._files_done += files
            self._progress.update(self._task, advance=nbytes, files_done=self._files_done)

    def __enter__(self) -> BarProgress:
        self._progress.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._progress.stop()
