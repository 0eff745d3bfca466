"""Download a bucket prefix in parallel from Python, with retries counted.

Runs as is against a throwaway SeaweedFS server (needs `pip install 'stoker[demo]'`); point
`URL` and `OPTIONS` at your own bucket to use it for real:

    python examples/download_bucket.py
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
        url = "s3://example/images"
        options = server.storage_options()  # endpoint, region and keys of the local server

        # Put 500 small JPEGs into the bucket.
        write_image_folder(Path(scratch, "src"), files=500)
        store = stoker.open_store(url, storage_options=options)
        stoker.upload(Path(scratch, "src"), store)

        # Download them back: 64 files in flight, resumable, MD5-verified.
        report = stoker.download(
            store, Path(scratch, "dst"), config=stoker.TransferConfig(workers=64)
        )
        print(
            f"{report.files_transferred} files, {report.bytes_transferred / 1e6:.1f} MB "
            f"at {report.files_per_s:,.0f} files/s; "
            f"{report.requests.get('requests.get', 0)} GETs, "
            f"{report.requests.get('retries', 0)} retries"
        )

        # Single objects: whole, or a byte range (one ranged GET).
        first = next(iter(store.list("class_00")))
        header = store.get_range(first.key, start=0, end=4)
        print(f"{first.key}: {first.size} bytes, starts with {bytes(header)!r}")


if __name__ == "__main__":
    main()
