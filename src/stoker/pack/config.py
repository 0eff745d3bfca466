"""How to pack (:class:`PackConfig`) and the default shard size every pack shares."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from stoker.format.spec import MAX_PREFIXES
from stoker.pack.reencode import ImagePolicy
from stoker.pack.video_reencode import VideoPolicy

DEFAULT_SHARD_BYTES = 128_000_000


@dataclass(frozen=True, slots=True, kw_only=True)
class PackConfig:
    """How to pack.

    Attributes:
        max_shard_bytes: Target shard size, cut by input bytes.
        samples_per_shard: Cut by sample count instead.
        images: Checking, resizing and re-encoding of images. Its ``check`` also says
            whether the other members are checked as training will decode them (``npy``
            headers and sizes, JSON, UTF-8 text, integer ``cls``; see
            :mod:`stoker.pack.fieldcheck`).
        videos: Resizing or re-timing videos, re-encoded once as H.264
            (:class:`~stoker.pack.video_reencode.VideoPolicy`); by default each is kept
            byte for byte.
        shuffle_seed: Pack the samples in the random order of this seed (recorded in the
            index), so that every read group, and so every batch, mixes classes whatever the
            order the input lists them in (class folders are sorted). None keeps the input's
            order, which windows of consecutive records (video frames) need.
        workers: Samples read at once (threads; reads release the GIL).
        shards_in_flight: Shards built at once (each holds its bytes in memory).
        engine: ``"local"`` threads, or ``"ray"`` tasks that each write whole shards.
        on_error: ``"raise"`` stops at the first bad input, naming it; ``"skip"`` leaves it
            out and records it, with the reason, in the manifest and the report.
        prefixes: Key prefixes the shards are spread over (``40/shard-000001.tar``), so
            that reads can pass one S3 prefix's request limit; 1 keeps them flat.
    """

    max_shard_bytes: int = DEFAULT_SHARD_BYTES
    samples_per_shard: int | None = None
    images: ImagePolicy = field(default_factory=ImagePolicy)
    videos: VideoPolicy = field(default_factory=VideoPolicy)
    shuffle_seed: int | None = 0
    workers: int = 32
    shards_in_flight: int = 2
    engine: Literal["local", "ray"] = "local"
    on_error: Literal["raise", "skip"] = "raise"
    prefixes: int = 1

    def __post_init__(self) -> None:
        if not 1 <= self.prefixes <= MAX_PREFIXES:
            raise ValueError(f"prefixes must be between 1 and {MAX_PREFIXES}, got {self.prefixes}")
        if self.workers < 1 or self.shards_in_flight < 1:
            raise ValueError("workers and shards_in_flight must be >= 1")
        if self.engine not in ("local", "ray"):
            raise ValueError(f"engine must be 'local' or 'ray', got {self.engine!r}")
        if self.on_error not in ("raise", "skip"):
            raise ValueError(f"on_error must be 'raise' or 'skip', got {self.on_error!r}")

    def output_params(self) -> dict[str, Any]:
        """The parameters that change the bytes written (part of the plan id)."""
        # One prefix adds nothing, so plans and manifests of flat packs stay as they were.
        spread = {"prefixes": self.prefixes} if self.prefixes > 1 else {}
        # Videos kept as they are add nothing either (plans of earlier packs stay valid).
        videos = {"videos": asdict(self.videos)} if self.videos.rewrites else {}
        return {"images": asdict(self.images), **videos, **spread}
