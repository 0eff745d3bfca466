"""Audio members decoded to arrays: :class:`AudioDecoder`, a field decoder for ``flac``,
``wav``, ``mp3``, ``ogg``/``opus`` or ``m4a`` bytes (a Hugging Face ``Audio`` column of a
Parquet table becomes such a member), through PyAV (``pip install 'stoker[video]'``)::

    audio = AudioDecoder(sample_rate=16_000, mono=True)
    FieldsConfig(decoders={"flac": audio, "wav": audio})

Without it audio members stay bytes.
"""

from __future__ import annotations

import io
import itertools
from dataclasses import dataclass
from typing import Any

import numpy as np

from stoker.format.video import VideoError, import_av

#: Longest audio decoded (one hour at 48 kHz): a bound on what a hostile file can make a
#: decode allocate.
MAX_SAMPLES = 48_000 * 3600


@dataclass(frozen=True, slots=True)
class AudioDecoder:
    """Decode audio bytes to ``float32`` samples ``(channels, samples)`` in [-1, 1].

    Attributes:
        sample_rate: Resample to this many samples per second (None: the file's own).
        mono: Mix the channels down to one.
        max_samples: Refuse audio longer than this many samples (per channel).
    """

    sample_rate: int | None = None
    mono: bool = False
    max_samples: int = MAX_SAMPLES

    def __post_init__(self) -> None:
        if self.sample_rate is not None and not 1 <= self.sample_rate <= 768_000:
            raise ValueError(f"sample_rate must be in 1..768000, got {self.sample_rate}")

    def __call__(self, data: bytes) -> np.ndarray:
        """The samples of ``data``.

        Raises:
            ValueError: Not audio PyAV decodes, or longer than ``max_samples``.
        """
        try:
            av = import_av()
        except VideoError as exc:
            raise ValueError(str(exc).replace("videos", "audio")) from None
        try:
            parts = self._decode(av, bytes(data))
        except _Refused as exc:
            raise ValueError(str(exc)) from None
        except Exception as exc:  # PyAV's errors (ValueError subclasses among them)
            raise ValueError(f"not decodable audio: {exc}") from exc
        if not parts:
            raise ValueError("no audio samples")
        return np.ascontiguousarray(np.concatenate(parts, axis=1), dtype=np.float32)

    def _decode(self, av: Any, data: bytes) -> list[np.ndarray]:
        parts: list[np.ndarray] = []
        count = 0
        container: Any
        with av.open(io.BytesIO(data), mode="r") as container:
            if not container.streams.audio:
                raise _Refused("no audio stream")
            stream = container.streams.audio[0]
            layout = "mono" if self.mono else (stream.layout.name or "stereo")
            rate = self.sample_rate or stream.rate
            resampler = av.AudioResampler(format="fltp", layout=layout, rate=rate)
            for frame in itertools.chain(container.decode(stream), [None]):  # None: the rest
                for out in resampler.resample(frame):
                    parts.append(out.to_ndarray())
                    count += out.samples
                    if count > self.max_samples:
                        raise _Refused(f"over {self.max_samples:,} samples")
        return parts


class _Refused(ValueError):
    """Audio this decoder refuses (as against what FFmpeg cannot read)."""
