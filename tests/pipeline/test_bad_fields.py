"""Bad members at pack and at read (issue 23): a truncated npy, invalid JSON and a caption
that is not UTF-8, each named (sample and field) or, with skip, counted and listed, where
the other tests do not reach: WebDataset tars given to ``stoker pack`` (tests/pack/
test_pack_field_checks.py packs files grouped by name), a packed dataset in a bucket read
with decode processes (tests/pipeline/test_bad_members.py reads tars indexed in place with
threads), and ``TorchLoader``'s worker processes."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner

from stoker import DecodeConfig
from stoker.cli.main import cli
from stoker.errors import SourceError
from stoker.pack.packer import PackConfig, pack
from stoker.pack.reencode import ImagePolicy
from stoker.pipeline.loader import Loader

SAMPLES = 12
BUCKET = "bad-fields"


def _npy(array: np.ndarray) -> bytes:
    out = io.BytesIO()
    np.save(out, array, allow_pickle=False)
    return out.getvalue()


def _good(i: int) -> dict[str, bytes]:
    return {
        "npy": _npy(np.arange(10, dtype=np.float32) * i),
        "json": json.dumps({"i": i, "nested": {"tags": ["a"] * (i % 3)}}).encode(),
        "txt": f"record {i}, ünïcode".encode(),
        "cls": str(i % 3).encode(),
    }


#: Kind -> (key of the bad sample, its member, the member's bytes, what stoker says).
BAD = {
    "truncated npy": (
        "0001",
        "npy",
        _npy(np.arange(10, dtype=np.float32))[:-7],
        "npy array of shape (10,) and dtype float32 needs 40 bytes of data, has 33",
    ),
    "invalid json": ("0004", "json", b'{"i": 4, "nested": {', "invalid JSON: Expecting"),
    "txt not utf-8": (
        "0007",
        "txt",
        b"caf\xe9 au lait",
        "not UTF-8 text: invalid continuation byte at byte 3",
    ),
}
GOOD_KEYS = sorted(
    f"{i:04d}" for i in range(SAMPLES) if f"{i:04d}" not in {b[0] for b in BAD.values()}
)


def _write_tars(root: Path, kinds: list[str]) -> Path:
    """Two tars written by webdataset (raw bytes), with the bad member of each kind."""
    import webdataset as wds

    bad = {BAD[kind][0]: BAD[kind][1:3] for kind in kinds}
    root.mkdir(parents=True)
    for shard in range(2):
        with wds.TarWriter(str(root / f"records-{shard:04d}.tar"), encoder=False) as sink:
            for i in range(shard, SAMPLES, 2):
                record: dict[str, Any] = {"__key__": f"{i:04d}", **_good(i)}
                if record["__key__"] in bad:
                    member, data = bad[record["__key__"]]
                    record[member] = data
                sink.write(record)
    return root


def _tar_of(key: str) -> str:
    return f"records-{int(key) % 2:04d}.tar"


@pytest.fixture(scope="module")
def tars(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Kind -> a folder of tars with that bad member; "all" -> one with each."""
    root = tmp_path_factory.mktemp("bad-tars")
    folders = {kind: _write_tars(root / f"bad{n}", [kind]) for n, kind in enumerate(BAD)}
    folders["all"] = _write_tars(root / "all", list(BAD))
    return folders


@pytest.mark.parametrize("kind", sorted(BAD))
def test_packing_tars_stops_naming_tar_sample_and_field(
    tars: dict[str, Path], tmp_path: Path, kind: str
) -> None:
    key, member, _, message = BAD[kind]
    with pytest.raises(SourceError) as caught:
        pack(tars[kind], tmp_path / "ds")
    where = tars[kind] / _tar_of(key)
    assert str(caught.value).startswith(f"{where}: sample {key!r}, field {member!r}: ")
    assert message in str(caught.value)
    assert not (tmp_path / "ds" / "index.json").exists()


def test_packing_tars_skips_counts_and_lists(tars: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "ds"
    result = CliRunner().invoke(
        cli, ["pack", str(tars["all"]), str(out), "--on-error", "skip", "--no-progress"]
    )
    assert result.exit_code == 0, result.output
    assert f"Skipped {len(BAD)} inputs" in result.output
    output = " ".join(result.output.split())  # rich wraps long lines
    manifest = json.loads((out / "index.json").read_text())
    assert manifest["samples"] == len(GOOD_KEYS)
    listed = {item["key"]: item for item in manifest["skipped"]}
    assert sorted(listed) == sorted(key for key, *_ in BAD.values())
    for key, member, _, message in BAD.values():
        reason = f"sample {key!r}, field {member!r}: {message}"
        assert reason in output
        assert listed[key]["source"] == str(tars["all"] / _tar_of(key))
        assert listed[key]["reason"].startswith(f"{listed[key]['source']}: {reason}")


@pytest.fixture(scope="module")
def packed(s3_server: Any, tars: dict[str, Path]) -> tuple[str, dict[str, Any]]:
    """The tars with each bad member packed unchecked into a bucket: they reach the reader."""
    s3_server.create_bucket(BUCKET)
    options = s3_server.storage_options()
    url = f"s3://{BUCKET}/ds"
    config = PackConfig(images=ImagePolicy(check=False), samples_per_shard=5)
    report = pack(tars["all"], url, storage_options=options, config=config)
    assert (report.samples, report.skipped) == (SAMPLES, [])
    return url, options


def _named(error: str, url: str) -> bool:
    """Whether ``error`` names one of the bad samples and its field, with the reason."""
    return any(
        f"{url}: sample {key!r}: field {member!r} (member {member!r}): {message}" in error
        for key, member, _, message in BAD.values()
    )


def test_decode_processes_name_sample_and_field(packed: tuple[str, dict[str, Any]]) -> None:
    url, options = packed
    decode = DecodeConfig(threads=2, method="process")
    with (
        Loader(url, batch_size=4, decode=decode, storage_options=options) as loader,
        pytest.raises(ValueError, match="sample") as caught,
    ):
        list(loader)
    assert _named(str(caught.value), url), caught.value


@pytest.mark.parametrize("method", ["thread", "process"])
def test_a_packed_dataset_in_a_bucket_skips_counts_and_lists(
    packed: tuple[str, dict[str, Any]], method: str
) -> None:
    url, options = packed
    decode = DecodeConfig(threads=2, method=method, on_error="skip")  # type: ignore[arg-type]
    with Loader(url, batch_size=4, decode=decode, storage_options=options) as loader:
        batches = list(loader)
        skipped = dict(loader.stats().skipped)
    _check_skipped(batches, skipped)


def _check_skipped(batches: list[dict[str, Any]], skipped: dict[str, str]) -> None:
    """The good samples once each with every field decoded; the bad ones listed, each
    with its field and reason."""
    keys = [key for batch in batches for key in batch["key"]]
    assert sorted(keys) == GOOD_KEYS
    assert sorted(skipped) == sorted(key for key, *_ in BAD.values())
    for key, member, _, message in BAD.values():
        assert re.fullmatch(
            rf"field '{member}' \(member '{member}'\): {re.escape(message)}.*", skipped[key]
        )
    for batch in batches:
        for n, key in enumerate(batch["key"]):
            i = int(key)
            assert batch["txt"][n] == f"record {i}, ünïcode"
            assert batch["json"][n] == {"i": i, "nested": {"tags": ["a"] * (i % 3)}}
            np.testing.assert_array_equal(
                np.asarray(batch["npy"][n]), np.arange(10, dtype=np.float32) * i
            )


def test_torch_workers_name_sample_and_field_or_skip_and_list(
    packed: tuple[str, dict[str, Any]],
) -> None:
    from stoker.integrations.torch import TorchLoader

    url, options = packed
    with pytest.raises(ValueError, match="sample") as caught:
        list(TorchLoader(url, batch_size=4, num_workers=1, storage_options=options))
    # The worker's error comes back with its traceback; its last line is stoker's message.
    assert _named(str(caught.value).strip().splitlines()[-1], url), caught.value

    skipping = TorchLoader(
        url,
        batch_size=4,
        num_workers=2,
        storage_options=options,
        decode=DecodeConfig(on_error="skip"),
    )
    batches = [{**b, "npy": b["npy"].numpy()} for b in skipping]
    _check_skipped(batches, dict(skipping.stats().skipped))
