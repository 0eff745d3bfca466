"""The per-sample function: a sample's fields and image decoded, and the user's transform
applied (timed apart from decoding). The decode pool runs it in threads, or in worker
processes (:mod:`stoker.pipeline.workers`)."""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from stoker.format.spec import IMAGE_FIELD_NAMES
from stoker.format.video import VideoError
from stoker.format.video_decode import ClipPackets, decode_clip
from stoker.pipeline.decode import DEFAULT_MAX_PIXELS, apply_plan, decode_full, decode_planned
from stoker.pipeline.fields import FieldsConfig, MissingField, decode_fields
from stoker.pipeline.transforms import PlannedTransform


class TransformTimer:
    """Time spent in a user's transform callable, added up by the decoder that calls it, so
    that decoding and the user's own code are timed apart: ``seconds`` of wall time (a
    transform that sleeps or waits shows it) and the ``cpu_seconds`` of it this thread ran."""

    __slots__ = ("cpu_seconds", "seconds")

    def __init__(self) -> None:
        self.seconds = 0.0
        self.cpu_seconds = 0.0


#: What :class:`SampleDecoder` gives for one sample: its transformed image (None for a
#: dataset without images) and its other fields, decoded (see :mod:`stoker.pipeline.fields`).
Decoded = tuple[Any, dict[str, Any]]


@dataclass(frozen=True, slots=True)
class SampleDecoder:
    """Decode one sample: its image through the transform, its other fields by extension;
    picklable for worker processes.

    Args:
        transform: A :class:`~stoker.pipeline.transforms.PlannedTransform`, any callable
            taking a ``PIL.Image``, or None (the full-size array).
        seed: Run seed; each sample's augmentation is seeded from ``(seed, epoch, index)``
            so results never depend on which thread or process decoded it.
        max_pixels: Refuse images larger than this before decoding (decompression bombs).
        fields: Which other fields the batch carries, and how (every member by default).
        image: Whether samples have an image for the transform (False for records of
            arrays or text: then no sample lacks one).
    """

    transform: Any
    seed: int
    max_pixels: int = DEFAULT_MAX_PIXELS
    fields: FieldsConfig = field(default_factory=FieldsConfig)
    image: bool = True
    # isinstance() on a runtime-checkable Protocol is slow: decided once, not per sample.
    planned: bool = field(init=False)
    image_names: tuple[str, ...] = field(init=False)
    others: FieldsConfig = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "planned", isinstance(self.transform, PlannedTransform))
        chosen = self.fields.chosen()
        names = IMAGE_FIELD_NAMES if chosen is None else chosen.get("image", IMAGE_FIELD_NAMES)
        object.__setattr__(self, "image_names", tuple(names) if self.image else ())
        if chosen is not None and "image" in chosen:  # the image is not one of the others
            chosen.pop("image")
            others = replace(self.fields, select=chosen)
        else:
            others = self.fields
        object.__setattr__(self, "others", others)

    def __call__(
        self,
        index: int,
        epoch: int,
        sample: dict[str, Any],
        out: np.ndarray | None = None,
        timer: TransformTimer | None = None,
    ) -> Decoded:
        """The decoded, transformed image of sample ``index`` (into ``out`` if given), and
        its other fields.

        A user transform's time (the callable's alone) is added to ``timer``, if given.

        A window (a unit with ``members``, see :class:`~stoker.pipeline.sources.WindowSource`)
        gives its members' images stacked, all with the window's augmentation (the same crop
        and flip for every frame of equal size), and each other field as a list of its
        members' values.

        Raises:
            MissingField: The sample lacks its image or a chosen field (see
                :class:`~stoker.pipeline.fields.FieldsConfig` ``missing``).
            ValueError: The sample failed its checks when read, or its image or a field
                cannot be decoded.
        """
        error = sample.get("error")
        if isinstance(error, ValueError):
            raise error
        if error is not None:  # in a worker process: the message only
            raise ValueError(error)
        members = sample.get("members")
        if members is not None:
            return self._window(index, epoch, members, out, timer)
        clip = sample.get("clip")
        if clip is not None:
            return self._clip(index, epoch, clip, sample["clip_bytes"], out, timer), {}
        name = next((f for f in self.image_names if f in sample), None)
        if name is None and self.image_names:
            present = sorted(k for k, v in sample.items() if isinstance(v, bytes | memoryview))
            if self.fields.missing != "none":
                raise MissingField(f"no image field (has {present})")
        others = decode_fields(sample, self.others, skip=(name,) if name else ())
        if name is None:
            return None, others
        return self._image(index, epoch, sample[name], out, timer), others

    def _image(
        self,
        index: int,
        epoch: int,
        data: bytes,
        out: np.ndarray | None,
        timer: TransformTimer | None,
    ) -> Any:
        rng = random.Random((self.seed * 1_000_003 + epoch) * 2**40 + index)
        if self.planned:
            return decode_planned(data, self.transform, rng, out=out, max_pixels=self.max_pixels)
        image = decode_full(data, max_pixels=self.max_pixels)
        if self.transform is None:
            return np.asarray(image)
        if timer is None:
            return self.transform(image)
        started, cpu_started = time.perf_counter(), time.thread_time()
        try:
            return self.transform(image)
        finally:
            timer.seconds += time.perf_counter() - started
            timer.cpu_seconds += time.thread_time() - cpu_started

    def _clip(
        self,
        index: int,
        epoch: int,
        clip: ClipPackets,
        data: bytes,
        out: np.ndarray | None,
        timer: TransformTimer | None,
    ) -> Any:
        """A video clip's frames, decoded from its packets, with one augmentation: a
        built-in transform plans one crop for the clip; a callable is called on each
        frame (as a ``PIL.Image``).

        Raises:
            ValueError: Frames of more than ``max_pixels`` (refused before decoding), or
                packets that do not decode.
        """
        if clip.width * clip.height > self.max_pixels:
            raise ValueError(f"frames of {clip.width}x{clip.height} pixels, over max_pixels")
        if self.planned and self.transform is not None:
            return self._planned_clip(index, epoch, clip, data, out)
        try:
            frames = decode_clip(clip, data)
        except VideoError as exc:
            raise ValueError(str(exc)) from exc
        if self.transform is None:
            return np.stack(frames, out=out) if out is not None else np.stack(frames)
        from PIL import Image

        started, cpu_started = time.perf_counter(), time.thread_time()
        try:
            done = [self.transform(Image.fromarray(frame)) for frame in frames]
        finally:
            if timer is not None:
                timer.seconds += time.perf_counter() - started
                timer.cpu_seconds += time.thread_time() - cpu_started
        if all(isinstance(x, np.ndarray) and x.shape == done[0].shape for x in done):
            return np.stack(done)
        return done

    def _planned_clip(
        self, index: int, epoch: int, clip: ClipPackets, data: bytes, out: np.ndarray | None
    ) -> np.ndarray:
        """A clip through a built-in transform: one crop planned for the clip on the full
        frame; frames converted to RGB already shrunk by the whole factor the crop leaves
        room for (as a JPEG decodes at a DCT scale), then cropped and resized."""
        rng = random.Random((self.seed * 1_000_003 + epoch) * 2**40 + index)
        plan = self.transform.plan(clip.width, clip.height, rng)
        left, top, box_w, box_h = plan.box
        out_h, out_w = plan.size
        shrink = max(1, int(min(box_w / out_w, box_h / out_h)))
        size = (max(1, round(clip.width / shrink)), max(1, round(clip.height / shrink)))
        try:
            frames = decode_clip(clip, data, size=None if shrink == 1 else size)
        except VideoError as exc:
            raise ValueError(str(exc)) from exc
        fx, fy = size[0] / clip.width, size[1] / clip.height
        scaled = replace(plan, box=(left * fx, top * fy, box_w * fx, box_h * fy))
        done = [
            apply_plan(frame, scaled, out=None if out is None else out[t])
            for t, frame in enumerate(frames)
        ]
        return out if out is not None else np.stack(done)

    def _window(
        self,
        index: int,
        epoch: int,
        members: list[dict[str, Any]],
        out: np.ndarray | None,
        timer: TransformTimer | None,
    ) -> Decoded:
        decoded = [
            self(index, epoch, member, None if out is None else out[r], timer)
            for r, member in enumerate(members)
        ]
        names = dict.fromkeys(name for _, others in decoded for name in others)
        others = {name: [d[1].get(name) for d in decoded] for name in names}
        images = [image for image, _ in decoded]
        if out is not None or not self.image_names:
            return out, others
        if all(isinstance(x, np.ndarray) and x.shape == images[0].shape for x in images):
            return np.stack(images), others
        raise ValueError(
            "a window's frames decode to different shapes; use a transform with a fixed output size"
        )
