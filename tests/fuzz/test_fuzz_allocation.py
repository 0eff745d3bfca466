"""No index, footer, tar header, npy header or ``.cls`` member makes stoker allocate more
than a bounded multiple of the bytes it read (issue 32 item 3 and its acceptance).

Each parse runs in a child process whose address space (``RLIMIT_AS``) is capped at what
it held after its imports plus :data:`BUDGET`: an input that makes it allocate past that
raises MemoryError there (or is killed), and the test fails naming the input. A clear
refusal (:class:`~stoker.errors.StokerError`, ``ValueError``) is a pass. The inputs are
small real files with seeded random mutations, and the hostile cases found by hand: a
``.cls`` of 30,000,000 (a class name per integer: 4.7 GB), one of 40 digits, a Parquet
footer claiming 10^9 rows (2.6 GB).
"""

from __future__ import annotations

import io
import multiprocessing
import random
import resource
import struct
import tarfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

#: What a parse may allocate beyond its process's size after imports: far more than any
#: of these inputs (a few kB) honestly needs, far less than the bombs asked for.
BUDGET = 256 << 20
MUTANTS = 12


def _vm_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmSize:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmSize in /proc/self/status")


def _child(parse: Callable[[bytes, Path], Any], inputs: list[bytes], folder: str, out: Any) -> None:
    limit = _vm_bytes() + BUDGET
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    for number, data in enumerate(inputs):
        try:
            parse(data, Path(folder) / str(number))
            out.send("ok")
        except MemoryError:
            out.send("MemoryError")
            return
        except Exception as exc:  # a refusal by name is what we want
            out.send(f"refused: {type(exc).__name__}: {str(exc)[:300]}")


def _run_bounded(
    parse: Callable[[bytes, Path], Any], inputs: list[bytes], folder: Path
) -> list[str]:
    """Each input's outcome: "ok", or "refused: ERROR: message"."""
    # Forked: the child starts with the imports already made, its size measured after.
    context = multiprocessing.get_context("fork")
    receive, send = context.Pipe(duplex=False)
    child = context.Process(target=_child, args=(parse, inputs, str(folder), send))
    child.start()
    send.close()
    results: list[str] = []
    while len(results) < len(inputs):
        if not receive.poll(120):
            child.kill()
            pytest.fail(f"{parse.__name__} stuck or died on {inputs[len(results)][:64]!r}")
        try:
            results.append(receive.recv())
        except EOFError:
            child.join()
            pytest.fail(
                f"{parse.__name__} died (exit {child.exitcode}) on {inputs[len(results)][:64]!r}"
            )
        assert results[-1] != "MemoryError", (
            f"{parse.__name__} allocated more than {BUDGET >> 20} MiB on "
            f"{len(inputs[len(results) - 1])} bytes: {inputs[len(results) - 1][:64]!r}"
        )
    child.join(60)
    return results


# -- the parses --------------------------------------------------------------------------


def parse_index(data: bytes, folder: Path) -> None:
    from stoker.format.index import read_index
    from stoker.storage import open_store

    folder.mkdir(parents=True)
    (folder / "index.json").write_bytes(data)
    read_index(open_store(str(folder)))


def parse_parquet(data: bytes, folder: Path) -> None:
    from stoker.format.foreign.parquet import ParquetReader

    folder.mkdir(parents=True)
    (folder / "f.parquet").write_bytes(data)
    reader = ParquetReader(str(folder / "f.parquet"))
    for ref in reader.refs()[:4]:
        reader.read(ref)


def parse_tar(data: bytes, folder: Path) -> None:
    from stoker.pack.indexer import index_webdataset

    folder.mkdir(parents=True)
    (folder / "shard.tar").write_bytes(data)
    index_webdataset(folder)


def parse_npy(data: bytes, folder: Path) -> None:
    from stoker.format.records import decode_npy

    decode_npy(data)


# -- the inputs --------------------------------------------------------------------------


def _tar(members: list[tuple[str, bytes]]) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


def _npy() -> bytes:
    out = io.BytesIO()
    np.save(out, np.arange(12, dtype=np.int32).reshape(3, 4))
    return out.getvalue()


def _parquet(rows: int = 5) -> bytes:
    import pyarrow as pa
    import pyarrow.parquet as pq

    out = io.BytesIO()
    pq.write_table(pa.table({"label": list(range(rows)), "txt": ["x"] * rows}), out)
    return out.getvalue()


def _index(tmp_path: Path) -> bytes:
    from stoker.pack.indexer import index_webdataset

    folder = tmp_path / "wds"
    folder.mkdir()
    (folder / "a.tar").write_bytes(_tar([("a.txt", b"alpha"), ("a.cls", b"1")]))
    index_webdataset(folder)
    return (folder / "index.json").read_bytes()


def _mutants(seed: int, data: bytes) -> list[bytes]:
    """Seeded mutations: bytes flipped, digits grown, runs of 0xff, cuts."""
    rng = random.Random(seed)
    out = []
    for _ in range(MUTANTS):
        mutant = bytearray(data)
        for _ in range(rng.randint(1, 8)):
            at = rng.randrange(len(mutant))
            kind = rng.random()
            if kind < 0.4:
                mutant[at] = rng.randrange(256)
            elif kind < 0.6:
                mutant[at:at] = b"9" * rng.randint(1, 40)
            elif kind < 0.8:
                mutant[at : at + 8] = b"\xff" * 8
            else:
                del mutant[at:]
                mutant += bytes(rng.randrange(256) for _ in range(rng.randint(0, 16)))
            if not mutant:
                mutant = bytearray(b"\x00")
        out.append(bytes(mutant))
    return out


def _lying_parquet(claimed: int) -> bytes:
    data = _parquet(77)

    def varint(number: int) -> bytes:
        encoded = bytearray()
        while True:
            low, number = number & 0x7F, number >> 7
            encoded.append(low | (0x80 if number else 0))
            if not number:
                return bytes(encoded)

    length = struct.unpack("<I", data[-8:-4])[0]
    footer = data[-8 - length : -8].replace(varint(77 * 2), varint(claimed * 2))
    return data[: -8 - length] + footer + struct.pack("<I", len(footer)) + b"PAR1"


# -- the tests ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("cls", "expected"),
    [(b"30000000", "ok"), (b"1" * 40, "refused: SourceError"), (b"7", "ok")],
)
def test_a_cls_member_cannot_make_the_index_huge(tmp_path: Path, cls: bytes, expected: str) -> None:
    data = _tar([("a.txt", b"alpha"), ("a.cls", cls)])
    [result] = _run_bounded(parse_tar, [data], tmp_path / "wds")
    assert result.startswith(expected), result
    if expected == "ok":
        assert (tmp_path / "wds" / "0" / "index.json").stat().st_size < 64 << 10


def test_a_parquet_footer_claiming_a_billion_rows(tmp_path: Path) -> None:
    [result] = _run_bounded(parse_parquet, [_lying_parquet(10**9)], tmp_path / "pq")
    assert result.startswith("refused: SourceError"), result
    assert "claims 1,000,000,000 rows" in result


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("kind", ["index", "parquet", "tar", "npy"])
def test_mutated_inputs_allocate_a_bounded_amount(tmp_path: Path, kind: str, seed: int) -> None:
    parses: dict[str, tuple[Callable[[bytes, Path], Any], Callable[[], bytes]]] = {
        "index": (parse_index, lambda: _index(tmp_path)),
        "parquet": (parse_parquet, _parquet),
        "tar": (parse_tar, lambda: _tar([("a.txt", b"alpha"), ("a.cls", b"3")])),
        "npy": (parse_npy, _npy),
    }
    parse, original = parses[kind]
    _run_bounded(parse, _mutants(seed, original()), tmp_path / kind)
