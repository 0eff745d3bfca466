"""The doctor on an unpacked folder in a slow bucket: it advises packing, not bigger blocks."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from stoker.pipeline.loader import Loader
from stoker.pipeline.order import OrderConfig
from stoker.pipeline.transforms import RandomResizedCrop
from stoker.profile.advice import format_diagnosis
from stoker.profile.doctor import diagnose
from stoker.storage.transfer import upload
from stoker.testing.images import write_image_folder
from stoker.testing.netproxy import LinkConfig, NetProxy
from stoker.testing.seaweed import SeaweedServer


def test_a_store_bound_folder_is_advised_to_pack(
    tmp_path: Path, s3_server: SeaweedServer, s3_bucket: Any
) -> None:
    write_image_folder(tmp_path / "src", files=48, classes=3, width=64, height=48)
    upload(tmp_path / "src", s3_bucket.store("train"))
    url = f"{s3_bucket.url}/train"
    link = LinkConfig(rtt_s=0.12, bandwidth_bytes_s=400_000)
    with (
        NetProxy("127.0.0.1", s3_server.port, link=link) as slow,
        Loader(
            url,
            batch_size=8,
            transform=RandomResizedCrop(16),
            storage_options=s3_bucket.options(slow.endpoint),
            prefetch=1,
            order=OrderConfig(group_blocks=8, block_size=1),  # a read group per batch
        ) as loader,
    ):
        diagnosis = diagnose(loader, step_s=0.002, max_batches=5, advice_for="cli")
    text = format_diagnosis(diagnosis)
    assert diagnosis.verdict == "input-bound: store", text
    assert any(f"`stoker pack {url} {url}-packed`" in line for line in diagnosis.advice), text
    assert not any("--block-size" in line for line in diagnosis.advice), text
    assert any("--cache-dir DIR" in line for line in diagnosis.advice), text
