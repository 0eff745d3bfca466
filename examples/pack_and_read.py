"""Pack an image folder from a bucket into indexed shards, then read samples at random.

Runs as is against a throwaway SeaweedFS server (needs `pip install 'stoker[demo]'`):

    python examples/pack_and_read.py
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import stoker
from stoker.testing.images import write_image_folder
from stoker.testing.seaweed import SeaweedServer


def main() -> None:
    with SeaweedServer() as server, tempfile.TemporaryDirectory() as scratch:
        server.create_bucket("example")
        options = server.storage_options()

        # 1,000 small JPEGs in 10 class folders, uploaded to s3://example/raw.
        write_image_folder(Path(scratch, "src"), files=1000, classes=10)
        stoker.upload(
            Path(scratch, "src"), stoker.open_store("s3://example/raw", storage_options=options)
        )

        # Pack them into shards of 250 samples, resized so the shorter side is 64 px.
        report = stoker.pack(
            "s3://example/raw",
            "s3://example/shards",
            storage_options=options,
            config=stoker.PackConfig(
                samples_per_shard=250, images=stoker.ImagePolicy(resize_shorter=64)
            ),
        )
        print(
            f"packed {report.samples} samples into {report.shards} shards "
            f"({report.source_format}) in {report.seconds:.1f} s"
        )

        # Open it (two GETs), read one sample and a batch (coalesced ranged GETs).
        dataset = stoker.open_dataset("s3://example/shards", storage_options=options)
        sample = dataset[42]
        print(
            f"sample 42: key={sample['key']} class={dataset.class_names[sample['label']]} "
            f"jpg={len(sample['jpg'])} bytes"
        )
        batch = dataset.read_many([7, 500, 501, 502, 999])
        print("batch keys:", [s["key"] for s in batch])
        print("verify:", "ok" if dataset.verify().ok else "CORRUPT")


if __name__ == "__main__":
    main()
