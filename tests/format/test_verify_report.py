"""VerifyReport's JSON."""

from __future__ import annotations

import json

from stoker.format.verify import VerifyReport


def test_to_dict_is_plain_json() -> None:
    report = VerifyReport(shards=2, samples=20, bytes=4096)
    sound = {"ok": True, "shards": 2, "samples": 20, "bytes": 4096, "corrupt": []}
    assert report.to_dict() == sound
    report.corrupt.append(("shard-000001.tar", "", "SHA-256 mismatch"))
    report.corrupt.append(("shard-000001.tar", "k7", "CRC-32 mismatch"))
    data = report.to_dict()
    assert data["ok"] is False
    assert data["corrupt"] == [
        {"shard": "shard-000001.tar", "sample": "", "problem": "SHA-256 mismatch"},
        {"shard": "shard-000001.tar", "sample": "k7", "problem": "CRC-32 mismatch"},
    ]
    assert json.loads(json.dumps(data)) == data
