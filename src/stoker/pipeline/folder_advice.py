"""The way on for data that is not a packed dataset: the ``stoker pack`` (or ``stoker
index``) command for it, and what packing gains over streaming a folder unpacked
(:mod:`stoker.pipeline.folder`)."""

from __future__ import annotations

import shlex
from collections.abc import Sequence

from stoker.errors import StokerError
from stoker.format.foreign.wds_tar import COMPRESSED_TAR_SUFFIXES
from stoker.storage.base import Store
from stoker.storage.url import parse_url

#: What packing gave in the full benchmarks/loader.py run (20,000 and 25,000 photos read
#: cold through a 20 ms / 1 Gbit/s link, 2 cores, so decoding bounds both): packed shards
#: streamed 1.16x (105 kB photos) and 2.67x (9 kB) the images/s of the folder, with 9x and
#: 64x fewer requests. The hint quotes it.
PACKED_SPEEDUP = (
    "1.2x (100 kB photos) to 2.7x (9 kB) faster on 2 cores, more where decoding keeps up, "
    "with 9x to 64x fewer requests"
)


def pack_command(url: str) -> str:
    """The ``stoker pack`` command for a folder, into a sibling prefix or directory, each
    URL quoted for a POSIX shell where it needs it (a key may hold ``?``, ``*`` or ``#``)."""
    parsed = parse_url(url)
    has_parent = bool(parsed.prefix.strip("/"))
    destination = shlex.quote(f"{url.rstrip('/')}-packed") if has_parent else "DST"
    return f"stoker pack {shlex.quote(url)} {destination}"


def no_dataset_error(
    url: str, reason: BaseException | None = None, *, names: Sequence[str] = ()
) -> FileNotFoundError:
    """The error for a location with neither a packed dataset's index nor image files, with
    the way on for what it holds (``names``: the keys directly under it). WebDataset tars
    are indexed in place (``stoker index``); other files are packed into a new location
    beside it; only an empty location is suggested as a place to pack into."""
    where = f" ({reason})" if reason is not None else ""
    quoted = shlex.quote(url)
    tars = sorted(n for n in names if n.endswith(".tar"))
    compressed = sorted(n for n in names if n.lower().endswith(COMPRESSED_TAR_SUFFIXES))
    if tars:
        way = (
            f"It holds {len(tars)} .tar file(s) ({tars[0]}, ...): if they are WebDataset "
            f"shards, index them in place with `stoker index {quoted}` (the tars stay as "
            "they are; index.json goes beside them) and open it again"
        )
    elif compressed:
        way = (
            f"It holds {len(compressed)} compressed tar(s) ({compressed[0]}, ...): stoker "
            "reads uncompressed tars; decompress them into a new location and index that "
            "with `stoker index URL`"
        )
    elif names:
        way = f"Pack it into a new location with `{pack_command(url)}` and open the copy"
    else:
        way = f"Pack your data into it with `stoker pack SRC {quoted}`"
    return FileNotFoundError(
        f"{url}: neither a packed dataset (no index.json) nor a folder of images{where}. "
        f"{way}, or point at a folder of class folders of images (ROOT/CLASS/IMAGE.jpg) to "
        "stream it unpacked"
    )


def names_at(store: Store) -> list[str]:
    """The keys directly under ``store``'s root, for an error's advice (none if unlistable)."""
    try:
        return [meta.key for meta in store.list_dir("").objects]
    except (OSError, StokerError):
        return []
