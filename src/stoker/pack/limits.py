"""How many reads a pack may keep open at once on this machine."""

from __future__ import annotations

#: Files a pack holds open besides its reads: the interpreter, libraries, logs, the store's
#: connection pool, the shards being written.
OPEN_FILE_HEADROOM = 64


def open_file_limit() -> int | None:
    """This process's soft limit on open files (``ulimit -n``), or None where unknown."""
    try:
        import resource
    except ImportError:  # not on Windows
        return None
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    return None if soft == resource.RLIM_INFINITY else int(soft)


def check_workers(workers: int) -> None:
    """Refuse more concurrent reads than the open-file limit allows (each read holds a file
    or a connection open), rather than failing halfway with "Too many open files".

    Raises:
        ValueError: Naming the limit and the most workers it allows.
    """
    limit = open_file_limit()
    if limit is not None and workers + OPEN_FILE_HEADROOM > limit:
        most = max(1, limit - OPEN_FILE_HEADROOM)
        raise ValueError(
            f"workers={workers} reads at once need about {workers + OPEN_FILE_HEADROOM} open "
            f"files, and this process may open {limit} (ulimit -n): use {most} workers or "
            "fewer, or raise the limit"
        )
