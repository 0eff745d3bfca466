"""Audio members decoded to arrays (issue 34: the Hugging Face Audio column): through a
Parquet table read in place, resampled and mixed down as asked; bad audio named."""

from __future__ import annotations

import io
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest

from stoker.format.audio import AudioDecoder
from stoker.pipeline.config import DecodeConfig
from stoker.pipeline.fields import FieldsConfig
from stoker.pipeline.loader import Loader
from stoker.pipeline.order import OrderConfig

av = pytest.importorskip("av")
pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")


def _tone(hz: float, *, rate: int = 22_050, seconds: float = 0.5, container: str = "flac") -> bytes:
    """A stereo sine of ``hz``, encoded losslessly."""
    codec = {"flac": "flac", "wav": "pcm_s16le"}[container]
    samples = np.arange(int(rate * seconds)) / rate
    wave = (0.5 * np.sin(2 * np.pi * hz * samples)).astype(np.float32)
    out = io.BytesIO()
    with av.open(out, mode="w", format=container) as muxer:
        stream = muxer.add_stream(codec, rate=rate)
        stream.layout = "stereo"
        frame = av.AudioFrame.from_ndarray(np.stack([wave, -wave]), format="fltp", layout="stereo")
        frame.rate, frame.pts, frame.time_base = rate, 0, Fraction(1, rate)
        for packet in stream.encode(frame):
            muxer.mux(packet)
        for packet in stream.encode(None):
            muxer.mux(packet)
    return out.getvalue()


def test_audio_decodes_to_float_samples_resampled_and_mixed_down() -> None:
    data = _tone(440.0)
    both = AudioDecoder()(data)
    assert both.shape == (2, 11_025)
    assert both.dtype == np.float32
    np.testing.assert_allclose(both[0], -both[1], atol=1e-4)
    assert 0.49 < float(np.abs(both[0]).max()) <= 0.51
    # 440 Hz: the strongest frequency of the decoded samples.
    spectrum = np.abs(np.fft.rfft(both[0]))
    assert abs(np.argmax(spectrum) * 22_050 / len(both[0]) - 440) < 5
    mono = AudioDecoder(sample_rate=16_000, mono=True)(_tone(440.0, container="wav"))
    assert mono.shape[0] == 1
    assert abs(mono.shape[1] - 8_000) <= 64
    assert float(np.abs(mono).max()) < 0.05  # the two channels cancel


def test_bad_audio_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="not decodable audio"):
        AudioDecoder()(b"RIFF\x00\x00\x00\x00WAVEjunk")
    with pytest.raises(ValueError, match="over 100 samples"):
        AudioDecoder(max_samples=100)(_tone(440.0))


def test_a_hugging_face_audio_column_decodes_through_the_loader(tmp_path: Path) -> None:
    tones = [220.0, 440.0, 880.0]
    table = pa.table(
        {
            "audio": [{"bytes": _tone(hz), "path": f"{n}.flac"} for n, hz in enumerate(tones)],
            "label": [0, 1, 2],
        }
    )
    pq.write_table(table, tmp_path / "speech.parquet")
    audio = AudioDecoder(mono=False)
    # A table with a bytes column may hold images; choosing the fields says it does not.
    fields = FieldsConfig(
        select={"audio": "audio.flac"}, decoders={"flac": audio}, pad={"audio": 0.0}
    )
    with Loader(
        str(tmp_path / "speech.parquet"),
        batch_size=3,
        decode=DecodeConfig(fields=fields),
        order=OrderConfig(mode="none"),
    ) as loader:
        (batch,) = list(loader)
    assert batch["audio"].shape == (3, 2, 11_025)
    assert batch["label"].tolist() == [0, 1, 2]
    for row, hz in zip(batch["audio"], tones, strict=True):
        spectrum = np.abs(np.fft.rfft(row[0]))
        assert abs(np.argmax(spectrum) * 22_050 / row.shape[1] - hz) < 5
